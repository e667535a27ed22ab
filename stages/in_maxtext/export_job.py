"""The convert_out stage's work, in one process: convert, assemble, check.

Run by convert_out (through stages.in_maxtext.main, for MaxText's environment and its HF
config swap):

    python -m stages.in_maxtext.main stages.in_maxtext.export_job --setup '{..., "hf_config": "models/base-hf"}' \
        --request '<contract.ExportJob: out, shard_bytes, report, the check's request and its MaxText flags>' \
        -- <MaxText's to_huggingface flags>

1. MaxText's `to_huggingface`, unmodified (run as its own __main__), writes its export to
   EXPORT/.maxtext-export;
2. stages/in_maxtext/assemble_export.py assembles the published export from it and the base (EXPORT);
3. stages/in_maxtext/logit_check.py checks it and writes its report.
One process instead of two saves a MaxText, JAX and transformers import (~20 s a run). Like
to_huggingface itself, the check then runs on the CPU, in float32.
"""

import json
import os
import runpy
import shutil
import sys
import time

from stages.in_maxtext import assemble_export, logit_check
from stages.in_maxtext.main import preload_imports
from stages.shared import contract

REQUEST = contract.ExportJob


def convert(to_hf_flags: list[str]) -> None:
    preload_imports(contract.TO_HUGGINGFACE)
    sys.argv = [contract.TO_HUGGINGFACE, *to_hf_flags]
    try:
        runpy.run_module(contract.TO_HUGGINGFACE, run_name="__main__", alter_sys=False)
    except SystemExit as e:  # absl's app.run exits when main returns
        if e.code not in (0, None):
            raise


def run(request: contract.ExportJob, maxtext_flags: list[str], setup: contract.Setup) -> None:
    raw = os.path.join(request.out, ".maxtext-export")
    started = time.monotonic()
    convert(maxtext_flags + [f"base_output_directory={raw}"])
    converted = time.monotonic()
    check = request.check
    sources = assemble_export.assemble(raw, check.base, request.out, check.dtype, request.shard_bytes, setup.model_name)
    shutil.rmtree(raw)
    assembled = time.monotonic()
    logit_check.run(check, request.check_flags, setup)
    with open(request.report) as f:
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
    with open(request.report, "w") as f:
        json.dump(report, f, indent=2)
