"""Stage convert_in: the base HF checkpoint converted to a MaxText (Orbax) checkpoint, checked.

    python -m stages.convert_in             # run
    python -m stages.convert_in --dry-run   # print the MaxText command, have MaxText validate it

Runs MaxText's `maxtext.checkpoint_conversion.to_maxtext` on models/base-hf/ and writes
models/base-maxtext/ (the parameters are at models/base-maxtext/0/items). MaxText takes the
architecture from its hard-coded table; stages/in_maxtext/main.py substitutes the
checkpoint's own config.json and reads the file's tensor names, so what is converted is
exactly the model that was downloaded.

Then the conversion check: MaxText on the converted parameters must produce the next-token
distributions transformers produces on models/base-hf/, on the export check's fixed prompts
(stages/in_maxtext/logit_check.py), within `convert_in.check`'s limits. If it fails, nothing is
written: a conversion that would train a different model than the one chosen never reaches
the TPU hours. Writes
  models/base-maxtext/         the converted parameters
  metrics/convert_check.json   KL, top-1 agreement, max logit difference (DVC metrics)
"""

import json
import os
import sys

from stages.lib import flags, gates, hardware, maxtext_process, outputs, paths
from stages.lib.cli import run
from stages.lib.params import load
from stages.shared import checkpoint, contract, families
from stages.shared.errors import StageFailed

OUT = paths.BASE_MAXTEXT
METRICS = os.path.join("metrics", "convert_check.json")


def check_conversion(params: dict, converted_dir: str) -> None:
    """The conversion check (in its own MaxText process); its metrics are written either way,
    and a failure raises before the converted checkpoint is published."""
    report_path = f"{converted_dir}.check.json"
    try:
        maxtext_process.run("convert_in.check", flags.conversion_check(params, converted_dir, report_path), params)
        with open(report_path) as f:
            report = json.load(f)
    finally:
        outputs.remove(report_path)
    failures = gates.logit.threshold_failures(report, params.convert_in.check)
    outputs.write_json(METRICS, gates.logit.metrics(report, not failures, "conversion"))
    if failures:
        raise gates.GateFailed(
            "conversion check",
            failures,
            f": MaxText on the converted checkpoint computes differently from transformers on {paths.BASE_HF}, so "
            f"training would start from a different model. Details per prompt in {METRICS}; nothing was written "
            f"to {OUT}",
        )
    print(
        f"convert_in: conversion check passed (max KL {report['kl_max']:.2g}, mean {report['kl_mean']:.2g}, top-1 "
        f"agreement {report['top1_agreement']:.4f})",
        flush=True,
    )


def main() -> None:
    params = load()
    families.check_convertible(paths.BASE_HF, params.model.maxtext_name)
    if "--dry-run" in sys.argv:
        maxtext_process.dry_run("convert_in", flags.convert_in(params, OUT), params)
        return
    hardware.check_present(params)
    size = checkpoint.parameter_count(paths.BASE_HF) * checkpoint.DTYPE_BYTES[params.convert_in.save_dtype]
    hardware.check_output_disk(OUT, 1.1 * size, "the MaxText checkpoint")
    with outputs.staged_dir(OUT) as tmp:
        maxtext_process.run(
            "convert_in",
            flags.convert_in(params, tmp),
            params,
            progress=maxtext_process.log_progress("convert_in", "converting weights:"),
            progress_every=5.0,
        )
        if not os.path.exists(os.path.join(paths.converted_params(tmp), "commit_success.txt")):
            raise StageFailed(
                f"{contract.TO_MAXTEXT} exited 0 but wrote no complete checkpoint (no commit_success.txt)"
            )
        check_conversion(params, tmp)
    print(f"convert_in: wrote {OUT}", flush=True)


if __name__ == "__main__":
    run(main, "convert_in")
