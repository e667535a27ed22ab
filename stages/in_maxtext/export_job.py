"""The convert_out stage's work, in one process: convert, assemble, check.

Run by convert_out (through stages.in_maxtext.main, for MaxText's environment and its HF
config swap):

    python -m stages.in_maxtext.main stages.in_maxtext.export_job --hf-config models/base-hf -- \
        --out EXPORT --dtype bfloat16 --shard-bytes N <export check's options> -- \
        <MaxText's to_huggingface arguments> --check-- <the export check's MaxText arguments>

1. MaxText's `to_huggingface`, unmodified (run as its own __main__), writes its export to
   EXPORT/.maxtext-export;
2. stages/in_maxtext/assemble_export.py assembles the published export from it and the base (EXPORT);
3. stages/in_maxtext/logit_check.py checks it and writes its report.
One process instead of two saves a MaxText, JAX and transformers import (~20 s a run). Like
to_huggingface itself, the check then runs on the CPU, in float32.
"""

import argparse
import json
import os
import runpy
import shutil
import sys
import time

from stages.in_maxtext import assemble_export, logit_check
from stages.in_maxtext.main import preload_imports
from stages.lib.flags import CHECK_SEPARATOR, TO_HUGGINGFACE


def convert(to_hf_args: list[str]) -> None:
    preload_imports(TO_HUGGINGFACE)
    sys.argv = [TO_HUGGINGFACE, *to_hf_args]
    try:
        runpy.run_module(TO_HUGGINGFACE, run_name="__main__", alter_sys=False)
    except SystemExit as e:  # absl's app.run exits when main returns
        if e.code not in (0, None):
            raise


def main() -> None:
    split = sys.argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="the export directory to fill (empty)")
    parser.add_argument("--shard-bytes", type=int, required=True)
    parser.add_argument("--report", required=True, help="the export check's report")
    logit_check.add_arguments(parser)
    ours = parser.parse_args(sys.argv[1:split])
    rest = sys.argv[split + 1 :]
    to_hf_args, check_args = rest[: rest.index(CHECK_SEPARATOR)], rest[rest.index(CHECK_SEPARATOR) + 1 :]

    raw = os.path.join(ours.out, ".maxtext-export")
    started = time.monotonic()
    convert(to_hf_args + [f"base_output_directory={raw}"])
    converted = time.monotonic()
    sources = assemble_export.assemble(raw, ours.base, ours.out, ours.dtype, ours.shard_bytes, ours.model_name)
    shutil.rmtree(raw)
    assembled = time.monotonic()
    logit_check.run(ours, {ours.out: ours.report}, check_args)
    with open(ours.report) as f:
        report = json.load(f)
    report["tensors"] = {
        "fine_tuned": sum(v == "maxtext" for v in sources.values()),
        "from_base": sum(v == "base" for v in sources.values()),
    }
    report["seconds"] = {
        "conversion": converted - started,
        "assembly": assembled - converted,
        "check": time.monotonic() - assembled,
    }
    with open(ours.report, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
