"""The pipeline against MaxText by hand, on the tiny recipe: overhead, variants, disk, throughput.

    python -m bench.pipeline --reps 2     # ~27 minutes on 2 cores; bench/run.py runs it with the rest

A: `dvc repro convert_out` in a fresh copy of the project whose inputs (base_model, dataset)
are already there, with an empty JAX compilation cache. B: the same three MaxText commands
(to_maxtext, train_sft, to_huggingface: built by the stages' own functions, so the flags are
the same) typed by hand in another fresh copy, also with an empty cache. Repetitions run in
the order B A A B ... so that drift on a noisy machine falls on both sides.

What has no by-hand equivalent is timed on its own row rather than counted as overhead: the
two gates (the conversion check and the export check, each a MaxText run plus transformers),
the fit check (a TPU recipe's compile;
on CPU a no-op), and the evaluate stage. The rest of the pipeline's own work (data checks,
the shuffled stream, DVC hashing and caching the outputs, assembling the export) is counted.
"""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import yaml

from bench.common import GB, Row, du, log, median, new_workspace, run_alone, stage_seconds, stages_run, timed, verdict  # noqa: E402

GATES = ("convert_in.check:stages.in_maxtext.logit_check", "convert_out.check:stages.in_maxtext.logit_check")


def prepared(path: Path) -> Path:
    """A fresh project copy with the pipeline's inputs built (untimed) and an empty compile cache."""
    root = new_workspace(path)
    timed(["dvc", "repro", "-q", "dataset", "base_model"], root)
    return root


def by_hand_commands(root: Path) -> list[tuple[list[str], dict]]:
    """What a user would type: the stages' MaxText commands, outputs where the stages put them."""
    here = os.getcwd()
    os.chdir(root)  # the stages build their paths from the project root
    try:
        import dataclasses

        from stages.lib import flags, maxtext_process, paths, stream
        from stages.lib.params import load
        from stages.shared import contract

        params = load()
        env = maxtext_process.child_env(params)
        work_dir = root / "by-hand-train"
        work_dir.mkdir()
        t = params["train"]
        # The same rows in the same order (arranged for the packer with the token lengths), written
        # before the clock starts.
        timed(["dvc", "repro", "-q", "token_lengths"], root)
        data = str(work_dir / "stream.jsonl")
        packing = stream.packing_for(params, np.load(os.path.join(paths.LENGTHS, "train.npy")))
        stream.write(os.path.join(paths.DATA, "train.jsonl"), data, t["seed"], t["num_epochs"], packing)
        final = work_dir / contract.SFT_RUN_NAME / "checkpoints" / str(t["steps"]) / "model_params"
        export = flags.convert_out(params, str(root / "by-hand-export"))
        export = dataclasses.replace(
            export,
            args=[f"load_parameters_path={final}" if a.startswith("load_parameters_path=") else a for a in export.args],
        )
        return [
            (maxtext_process.command(flags.convert_in(params, paths.BASE_MAXTEXT)), env),
            (maxtext_process.command(flags.train(params, str(work_dir), str(work_dir / "metrics.jsonl"), data)), env),
            (maxtext_process.command(export), env),
        ]
    finally:
        os.chdir(here)


def run_by_hand(root: Path) -> float:
    return sum(timed(cmd, root, extra_env=env).seconds for cmd, env in by_hand_commands(root))


def run_pipeline(root: Path) -> dict:
    run = timed(["dvc", "repro", "convert_out"], root, sample_rss=True)
    times = stage_seconds(run.output)
    gates = sum(times[gate] for gate in GATES)
    no_by_hand = gates + times["fit_check"]
    train_metrics = json.loads((root / "dvclive" / "metrics.json").read_text())["run"]
    return {
        "wall": run.seconds,
        "comparable": run.seconds - no_by_hand,
        "gate": gates,
        "fit_check": times["fit_check"],
        "train": train_metrics,
        "peak_rss": run.peak_rss,
    }


def disk_ratio(root: Path) -> tuple[int, int]:
    """(bytes in the workspace's outputs + DVC cache, bytes of the distinct outputs dvc.lock lists)."""
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    outs = {o["path"]: o.get("size", 0) for stage in lock["stages"].values() for o in stage.get("outs", [])}
    used = du(*(root / p for p in outs), root / ".dvc" / "cache", root / ".scratch")
    return used, sum(outs.values())


def variant(root: Path) -> dict:
    """A train-only param change run as users do: time outside the stages that must re-run."""
    run = timed(["dvc", "exp", "run", "-S", "train.learning_rate=2e-3", "convert_out"], root)
    times = stage_seconds(run.output)
    inside = times["train"] + times["convert_out"]
    return {"wall": run.seconds, "outside": run.seconds - inside, "ran": stages_run(run.output)}


def bench(work: Path, reps: int = 2) -> list[Row]:
    return bench_with_runtime_rss(work, reps)[0]


def bench_with_runtime_rss(work: Path, reps: int) -> tuple[list[Row], dict[str, int]]:
    """The rows, and the peak RSS of each kind of process in the first `dvc repro` (the
    tiny model's: what conversion runs hold before any weights; see bench/conversion.py)."""
    a, b = [], []
    extras = {}
    order = "".join("BA" if i % 2 == 0 else "AB" for i in range(reps))
    for i in range(reps):
        for side in order[2 * i : 2 * i + 2]:
            root = prepared(work / f"{side}{i}")
            if side == "A":
                log(f"pipeline: dvc repro (rep {i + 1}/{reps})")
                a.append(run_pipeline(root))
                log(f"pipeline: dvc repro took {a[-1]['wall']:.0f} s")
                if not extras:  # once: evaluate, disk, a variant, on the first complete run
                    extras["evaluate"] = stage_seconds(timed(["dvc", "repro", "evaluate"], root).output)["evaluate"]
                    extras["disk"] = disk_ratio(root)
                    extras["variant"] = variant(root)
            else:
                log(f"pipeline: by hand (rep {i + 1}/{reps})")
                b.append(run_by_hand(root))
                log(f"pipeline: by hand took {b[-1]:.0f} s")
            shutil.rmtree(root)

    pipeline, by_hand = median([r["comparable"] for r in a]), median(b)
    overhead = pipeline / by_hand
    used, distinct = extras["disk"]
    v = extras["variant"]
    gate = median([r["gate"] for r in a])
    tokens = median([r["train"]["median_tokens_per_sec_per_device"] for r in a])
    step = median([r["train"]["median_step_time_s"] for r in a])
    outside_ok = "convert_in" not in v["ran"] and v["outside"] <= 0.05 * v["wall"]
    return [
        Row(
            "1. pipeline overhead: dvc repro vs MaxText by hand (tiny, clean)",
            f"{pipeline:.1f} s",
            f"{by_hand:.1f} s",
            f"{overhead:.3f}x",
            "<= 1.05x",
            verdict(overhead <= 1.05),
            [
                f"dvc repro wall {median([r['wall'] for r in a]):.1f} s, less the two gates and the fit check; "
                f"{reps} rep(s) each, in the order {' '.join(order)}"
            ],
        ),
        Row(
            "1b. conversion and export checks (no by-hand equivalent)",
            f"{gate:.1f} s",
            f"{by_hand:.1f} s",
            f"{gate / by_hand:.3f}x",
            "its own row",
            "info",
        ),
        Row(
            "1c. evaluate stage (no by-hand equivalent)",
            f"{extras['evaluate']:.1f} s",
            f"{by_hand:.1f} s",
            f"{extras['evaluate'] / by_hand:.3f}x",
            "its own row",
            "info",
        ),
        Row(
            "3. variant: train-only change, time outside train + convert_out",
            f"{v['outside']:.1f} s",
            f"{v['wall']:.1f} s",
            f"{v['outside'] / v['wall']:.3f}",
            "~0 (<= 5%), convert_in skipped",
            verdict(outside_ok, "" if "convert_in" not in v["ran"] else "convert_in ran"),
            [f"`dvc exp run -S train.learning_rate=2e-3 convert_out` ran {', '.join(v['ran'])}"],
        ),
        Row(
            "4. disk: workspace outputs + DVC cache vs distinct outputs",
            f"{used / GB:.3f} GB",
            f"{distinct / GB:.3f} GB",
            f"{used / distinct:.3f}x",
            "<= 1.05x",
            verdict(used / distinct <= 1.05),
        ),
        Row(
            "7. training throughput on this CPU (tiny)",
            f"{tokens:.0f} tokens/s/device",
            f"{step:.3f} s/step",
            "-",
            "regression tracking",
            "info",
        ),
    ], a[0]["peak_rss"]


if __name__ == "__main__":
    run_alone("pipeline", bench, reps=2)
