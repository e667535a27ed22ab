"""Stage convert_out: the fine-tuned parameters as a Hugging Face checkpoint, checked.

    python -m stages.convert_out

Runs MaxText's `maxtext.checkpoint_conversion.to_huggingface` on models/sft-maxtext/, turns
its output into a drop-in replacement for models/base-hf/ (stages/lib/export.py), then
checks it: the export, loaded with `transformers`, must produce the same next-token
distributions as MaxText does from the checkpoint it came from, on fixed chat prompts
(stages/lib/export_check.py). If the check fails, the stage fails and nothing is written,
so a broken export is never cached or pushed. Writes
  models/sft-hf/              config.json, sharded safetensors, tokenizer, chat template
  metrics/export_check.json   KL, top-1 agreement, max logit difference (DVC metrics)
"""

import json
import os
import sys

from stages.lib import export, gemma3, hardware, maxtext, outputs, paths
from stages.lib.cli import StageFailed, run
from stages.lib.params import load

BASE = paths.BASE_HF
SFT = paths.SFT_PARAMS
OUT = paths.SFT_HF
METRICS = os.path.join("metrics", "export_check.json")
MODULE = "maxtext.checkpoint_conversion.to_huggingface"


def threshold_failures(report: dict, limits: dict) -> list[str]:
    failures = []
    if report["kl_max"] > limits["max_kl"]:
        failures.append(f"max KL {report['kl_max']:.3g} > {limits['max_kl']:g}")
    if report["kl_mean"] > limits["max_mean_kl"]:
        failures.append(f"mean KL {report['kl_mean']:.3g} > {limits['max_mean_kl']:g}")
    if report["top1_agreement"] < limits["min_top1_agreement"]:
        failures.append(f"top-1 agreement {report['top1_agreement']:.4f} < {limits['min_top1_agreement']:g}")
    return failures


def check_export(params: dict, export_dir: str, report_path: str) -> tuple[dict, list[str]]:
    """The export check: config.json equal to the base's, and logits equal to MaxText's.

    Returns the logits report and the list of failures (empty: passed).
    """
    failures = [f"config.json differs from the base's: {d}" for d in export.config_differences(export_dir, BASE)]
    limits = params["convert_out"]["check"]
    args = ["--export", export_dir, "--report", report_path, "--tie-margin", str(limits["tie_margin"]), "--"]
    # The reference is the trained model as trained: float32 weights, float32 compute, and for
    # a LoRA run the base with its adapter applied by MaxText at run time, so that the merge
    # (stages/lib/merge_lora.py) is checked too. The export's own rounding to bf16 is part of
    # what is measured; the thresholds sit above it.
    args += maxtext.common_args(params, BASE)
    if os.path.isdir(paths.SFT_LORA):
        args += [f"load_parameters_path={os.path.abspath(paths.BASE_MAXTEXT_PARAMS)}",
                 f"lora.lora_restore_path={os.path.abspath(paths.SFT_LORA)}"] + maxtext.lora_args(params)
    else:
        args += [f"load_parameters_path={os.path.abspath(SFT)}"]
    maxtext.run("convert_out.check", "stages.lib.export_check", args, params)
    with open(report_path) as f:
        report = json.load(f)
    return report, failures + threshold_failures(report, limits)


def maxtext_args(params: dict, out_dir: str) -> list[str]:
    return maxtext.common_args(params, BASE) + [
        "use_multimodal=false",
        f"load_parameters_path={os.path.abspath(SFT)}",
        f"base_output_directory={out_dir}",
        "run_name=convert_out",
        # Convert in float32 and round once, at the end (export.assemble): MaxText's bf16
        # path rounds Gemma's 1+w norm scales before subtracting 1, four times coarser.
        "weight_dtype=float32",
        f"--hf_model_path={BASE}",  # tokenizer source: the base, not the Hub
    ]


def main() -> None:
    params = load()
    c = params["convert_out"]
    gemma3.check_convertible(BASE, params["model"]["maxtext_name"])
    if "--dry-run" in sys.argv:
        maxtext.dry_run("convert_out", MODULE, maxtext_args(params, os.path.abspath(OUT)), params, hf_config=BASE)
        return
    hardware.check_present(params)
    # MaxText's float32 export and the assembled one exist side by side for a moment.
    hardware.check_output_disk(OUT, 1.1 * gemma3.parameter_count(BASE) * (4 + gemma3.DTYPE_BYTES[c["dtype"]]), "the HF export")
    with outputs.staged_dir(OUT) as tmp:
        raw = os.path.join(tmp, ".maxtext-export")
        maxtext.run("convert_out", MODULE, maxtext_args(params, raw), params, hf_config=BASE,
                    progress=maxtext.log_progress(os.path.join(maxtext.LOG_DIR, "convert_out.log"), "converting weights:"),
                    progress_every=10.0)
        sources = export.assemble(raw, BASE, tmp, c["dtype"], c["shard_size_mb"] * 1024 * 1024)
        outputs.remove(raw)
        print(f"convert_out: assembled {len(sources)} tensors "
              f"({sum(v == 'maxtext' for v in sources.values())} fine-tuned, {sum(v == 'base' for v in sources.values())} from the base)",
              flush=True)

        report_path = os.path.join(os.path.dirname(tmp), f".export_check-{os.getpid()}.json")
        try:
            report, failures = check_export(params, tmp, report_path)
        finally:
            outputs.remove(report_path)
        report["passed"] = not failures
        outputs.write_json(METRICS, report)
        if failures:
            raise StageFailed(
                "the export does not reproduce the MaxText checkpoint (" + "; ".join(failures) + f"); details in {METRICS}. "
                "Nothing was written to " + OUT
            )
    print(f"convert_out: export check passed (max KL {report['kl_max']:.2g}, top-1 agreement "
          f"{report['top1_agreement']:.4f}); wrote {OUT}", flush=True)


if __name__ == "__main__":
    run(main, "convert_out")
