"""Stage convert_out: the fine-tuned parameters as a Hugging Face checkpoint, checked.

    python -m stages.convert_out

Runs MaxText's `maxtext.checkpoint_conversion.to_huggingface` on the tuned parameters
(models/sft-maxtext/, or models/preference-maxtext/ where the preference stage made a model:
paths.tuned_params), turns
its output into a drop-in replacement for models/base-hf/ (stages/in_maxtext/assemble_export.py), then
checks it: the export, loaded with `transformers`, must produce the same next-token
distributions as MaxText computing the same weights, on fixed chat prompts
(stages/in_maxtext/logit_check.py); all three in one MaxText process (stages/in_maxtext/export_job.py).
If the check fails, the stage fails and nothing is written, so a broken export is never
cached or pushed. Writes
  models/sft-hf/              config.json, sharded safetensors, tokenizer, chat template
  metrics/export_check.json   KL, top-1 agreement, max logit difference (DVC metrics)
"""

import json
import os
import sys

from stages.lib import flags, gates, hardware, maxtext_process, outputs, paths
from stages.lib.cli import run
from stages.lib.params import load
from stages.shared import checkpoint, contract, families

OUT = paths.SFT_HF
METRICS = os.path.join("metrics", "export_check.json")


def check_exports(params: dict, exports: dict[str, str]) -> list[tuple[dict, list[str]]]:
    """The export check of existing exports ({export directory: report path}), in one MaxText
    process (convert_out checks its own in export_job).

    Returns, per export, the report and the list of failures (empty: passed).
    """
    maxtext_process.run("convert_out.check", flags.export_check(params, exports), params)
    checked = []
    for report_path in exports.values():
        with open(report_path) as f:
            report = json.load(f)
        checked.append((report, gates.logit.failures(report, params.convert_out.check)))
    return checked


def failed(failures: list[str]) -> gates.GateFailed:
    """What failed, what it means, what to do: the trained parameters stay cached, so after a
    fix `dvc repro` runs convert_out (and evaluate) again, not training."""
    if any(f.startswith("config.json") for f in failures):
        cause = "the export's config.json is not the base's: MaxText's converter changed the architecture"
    elif any(f.startswith("LoRA merge") for f in failures):
        cause = "the merged weights (stages/in_maxtext/merge_lora.py) do not compute what the adapter does"
    else:
        cause = (
            "the export's weights, rounded exactly as exported, compute differently in transformers than in "
            "MaxText: a tensor mapped wrongly, or a config field the two libraries read differently"
        )
    return gates.GateFailed(
        "export check",
        failures,
        f": {cause}. Details per prompt in {METRICS}; nothing was written to {OUT}. The trained parameters "
        f"({paths.SFT_MAXTEXT}) are cached: once the cause is fixed, `dvc repro` re-runs convert_out and evaluate "
        "only",
    )


def main() -> None:
    params = load()
    c = params.convert_out
    families.check_convertible(paths.BASE_HF, params.model.maxtext_name)
    if "--dry-run" in sys.argv:
        maxtext_process.dry_run("convert_out", flags.convert_out(params, OUT), params)
        return
    hardware.check_present(params)
    # MaxText's float32 export and the assembled one exist side by side for a moment.
    size = checkpoint.parameter_count(paths.BASE_HF) * (4 + checkpoint.DTYPE_BYTES[c["dtype"]])
    hardware.check_output_disk(OUT, 1.1 * size, "the HF export")
    with outputs.staged_dir(OUT) as tmp:
        report_path = os.path.join(os.path.dirname(tmp), f".export_check-{os.getpid()}.json")
        try:
            maxtext_process.run(
                "convert_out",
                flags.export_job(params, tmp, report_path),
                params,
                progress=maxtext_process.log_progress("convert_out", "converting weights:"),
                progress_every=5.0,
                on_disk_full=f"The export needs ~{1.1 * size / 1e9:.2f} GB beside {OUT}: free that much, then "
                "`dvc repro` converts again (the trained parameters are cached)",
            )
            with open(report_path) as f:
                report = json.load(f)
        finally:
            outputs.remove(report_path)
        t, seconds = report.pop("tensors"), report.pop("seconds")
        print(
            f"convert_out: {contract.TO_HUGGINGFACE} done in {seconds['conversion']:.1f} s; assembled "
            f"{t['fine_tuned']} fine-tuned tensors and {t['from_base']} from the base",
            flush=True,
        )
        print(f"convert_out.check: stages.in_maxtext.logit_check done in {seconds['check']:.1f} s", flush=True)
        failures = gates.logit.failures(report, c["check"])
        outputs.write_json(METRICS, gates.logit.metrics(report, passed=not failures))
        if failures:
            raise failed(failures)
    print(
        f"convert_out: export check passed (max KL {report['kl_max']:.2g}, top-1 agreement "
        f"{report['top1_agreement']:.4f}); wrote {OUT}",
        flush=True,
    )


if __name__ == "__main__":
    run(main, "convert_out")
