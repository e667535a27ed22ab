"""What the pipeline made, at a glance: the data, the loss before and after, the export checks
(the Hugging Face export and each GGUF file), the benchmarks and how long each stage took.

    python -m tools.summary

Reads the metric files the stages wrote (metrics/*.json, dvclive*/metrics.json) and the stage
times `dvc repro` logged (logs/stage_times.json); runs nothing. A stage that has not run yet
is left out. `dvc metrics show` has every figure; `dvc plots show` draws the curves.
"""

import argparse
import os
import sys

from stages.lib import outputs
from stages.lib.cli import STAGE_TIMES
from stages.lib.dvc_yaml import stage_names
from stages.lib.params import load

DVC_YAML = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dvc.yaml")  # the stages' order


def duration(seconds: float) -> str:
    """42 s, 1:35 (m:ss), 1:02:05 (h:mm:ss)."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    s = round(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def gate_line(name: str, figures: dict, limits: dict | None) -> str:
    """One gate's verdict and figures (convert_in's conversion check, convert_out's export
    check, export_gguf's check of one file), beside its limits (the params' `check`: max_kl,
    max_mean_kl) when params.yaml is there to say them."""
    limit = (lambda key: f" (limit {limits[key]:g})") if limits else (lambda key: "")
    return (
        f"{name:<12s}{'passed' if figures['passed'] else 'FAILED'}: max KL {figures['kl_max']:.2g}{limit('max_kl')}, "
        f"mean KL {figures['kl_mean']:.2g}{limit('max_mean_kl')}, top-1 agreement {figures['top1_agreement']:.4f}"
    )


def lines(found: dict[str, dict], limits: dict | None) -> list[str]:
    """The summary's lines from the files' contents ({path: parsed JSON}) and the params
    (`limits`: params.yaml, or None); pure, for tests."""
    out = []
    data, lengths = found.get("metrics/dataset.json", {}), found.get("metrics/token_lengths.json", {})
    if data:
        train, held_out = data["train"], data["eval"]
        median = lengths.get("train", {}).get("median_tokens")
        out.append(
            f"data        {train['rows']:,} training conversations"
            + (f" ({train['skipped']} bad rows skipped)" if train["skipped"] else "")
            + (f", median {median:,} tokens" if median is not None else "")
            + f"; {held_out['rows']:,} held out"
        )
    conversion = found.get("metrics/convert_check.json", {}).get("conversion")
    if conversion:
        out.append(gate_line("conversion", conversion, limits and limits["convert_in"]["check"]))
    run = found.get("dvclive/metrics.json", {}).get("run")
    if run and run.get("steps"):
        out.append(
            f"training    {run['steps']} steps, loss {run['first_step_loss']:.3f} -> {run['final_loss']:.3f}"
            + (f", held-out {run['final_eval_loss']:.3f}" if run.get("final_eval_loss") is not None else "")
            + f"; {run['median_tokens_per_sec_per_device']:,.0f} tokens/s per device"
            + (f", MFU {run['mfu']:.1%}" if run.get("mfu") is not None else "")
        )
    preference = found.get("dvclive-preference/metrics.json", {}).get("run")
    if preference and preference.get("steps"):
        p = preference
        out.append(
            f"preference  {p['algorithm']}, {p['steps']} steps, loss {p['first_step_loss']:.3f}"
            f" -> {p['final_loss']:.3f}, reward accuracy {p['reward_accuracy']:.3f} (training)"
        )
    heldout = found.get("metrics/eval.json", {}).get("eval")
    if heldout:
        out.append(
            f"held-out    loss {heldout['base_loss']:.3f} (base) -> {heldout['fine_tuned_loss']:.3f} (fine-tuned), "
            f"perplexity {heldout['base_perplexity']:,.4g} -> {heldout['fine_tuned_perplexity']:,.4g}, "
            f"{heldout['target_tokens']:,} target tokens"
        )
        if "pairs" in heldout:
            h = heldout
            out.append(
                f"pairs       {h['pairs']} held out: chosen preferred {h['sft_preference_accuracy']:.3f} (SFT)"
                f" -> {h['preference_tuned_preference_accuracy']:.3f} (preference-tuned), reward accuracy "
                f"{h['reward_accuracy']:.3f}; loss {h['preference_tuned_loss']:.3f} (preference-tuned)"
            )
    export = found.get("metrics/export_check.json", {}).get("export")
    if export:
        out.append(gate_line("export", export, limits and limits["convert_out"]["check"]))
    for kind, figures in found.get("metrics/gguf_check.json", {}).get("gguf", {}).items():
        # gguf.check's limits for this type, where params.yaml still names it
        check = limits and limits["gguf"]["check"].get(kind)
        out.append(gate_line(f"gguf {kind}", figures, check) + f"; {figures['file']}, {figures['bytes'] / 1e6:,.1f} MB")
    benchmarks = found.get("metrics/benchmark.json", {}).get("benchmark")
    if benchmarks:
        out.append(
            "benchmarks  "
            + ", ".join(f"{name} {s['base']:.3f} -> {s['fine_tuned']:.3f}" for name, s in benchmarks.items())
            + " (base -> fine-tuned; eval/benchmark.md)"
        )
    times = found.get(STAGE_TIMES, {})
    if times:
        order = stage_names(DVC_YAML)
        ran = [s for s in order if s in times] + sorted(set(times) - set(order))
        out.append(
            "time        "
            + ", ".join(f"{s} {duration(times[s])}" for s in ran)
            + f"; {duration(sum(times[s] for s in ran))} in all (each stage's last run)"
        )
    return out


def main() -> None:
    argparse.ArgumentParser(prog="python -m tools.summary", description=__doc__.split("\n\n")[0]).parse_args()
    paths = [
        "metrics/dataset.json",
        "metrics/token_lengths.json",
        "metrics/convert_check.json",
        "dvclive/metrics.json",
        "dvclive-preference/metrics.json",
        "metrics/eval.json",
        "metrics/export_check.json",
        "metrics/gguf_check.json",
        "metrics/benchmark.json",
        STAGE_TIMES,
    ]
    found = {p: outputs.read_json(p, {}) for p in paths}
    limits = load() if os.path.exists("params.yaml") else None
    summary = lines(found, limits)
    if not summary:
        sys.exit("summary: nothing to summarise yet; run `dvc repro` first")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
