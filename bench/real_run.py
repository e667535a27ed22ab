"""A real recipe's whole run, stage by stage: wall time and peak memory (the small-chat recipe's
figures in docs/benchmarks.md, "Real data, real benchmarks").

    python -m bench.real_run                        # small-chat in a fresh copy of the project (~52 minutes)
    python -m bench.real_run --recipe small --keep /tmp/small-run

A fresh copy of the project (its own git repository, DVC cache and empty JAX compilation
cache: bench/common.py's new_workspace), switched to the recipe, then `dvc repro` as a user
types it, every process of the run sampled every 0.1 s. Prints, per stage, the time its own
`done in` line reports and the peak resident memory of its processes (the stage's own and the
MaxText process it started, each at its peak), then the whole run's wall time and its
metrics: the held-out loss, the benchmark scores with their standard errors. Not part of
bench/run.py's table: one run of it takes longer than that whole suite.
"""

import argparse
import json
import re
import tempfile
from pathlib import Path

from bench.common import GB, new_workspace, stage_seconds, timed


def stage_of(kind: str) -> str | None:
    """The stage a sampled process belongs to: `python -m stages.<name>` or a MaxText child
    whose log names it (the child's kind is its module; the stage is read from the output)."""
    found = re.search(r"-m stages\.(\w+)", kind)
    return found.group(1) if found else None


# The MaxText modules each stage runs (what bench.common.tree_rss calls a child's kind).
CHILDREN = {
    "token_lengths": ("stages.in_maxtext.count_tokens",),
    "convert_in": ("maxtext.checkpoint_conversion.to_maxtext", "stages.in_maxtext.logit_check"),
    "train": ("maxtext.trainers.post_train.sft.train_sft", "stages.in_maxtext.data_position"),
    "convert_out": ("stages.in_maxtext.export_job",),
    "evaluate": ("stages.in_maxtext.heldout",),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe", default="small-chat")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-real-run-") as work:
        root = new_workspace(args.keep or Path(work) / "run", args.recipe)
        run = timed(["dvc", "repro"], root, sample_rss=True)
        seconds = stage_seconds(run.output)
        peaks = {}
        for kind, rss in run.peak_rss.items():
            stage = stage_of(kind) or next((s for s, mods in CHILDREN.items() if kind in mods), None)
            if stage:
                peaks[stage] = max(peaks.get(stage, 0), rss)
        stages = [line.split("'")[1] for line in run.output.splitlines() if line.startswith("Running stage '")]
        print(f"{args.recipe}: `dvc repro` in {run.seconds:.0f} s ({run.seconds / 60:.1f} min) in {root}")
        print("| stage | time | peak RSS (its largest process) |\n|---|---|---|")
        for stage in stages:
            print(f"| {stage} | {seconds.get(stage, 0):.0f} s | {peaks.get(stage, 0) / GB:.1f} GB |")
        metrics = {}
        for name in ("eval", "benchmark", "dataset", "token_lengths"):
            path = root / "metrics" / f"{name}.json"
            if path.exists():
                metrics[name] = json.loads(path.read_text())
        summary = root / "dvclive" / "metrics.json"
        if summary.exists():
            metrics["train"] = json.loads(summary.read_text()).get("run")
        print(json.dumps(metrics, indent=1))


if __name__ == "__main__":
    main()
