"""Huge pages for MaxText's memory (stages/lib/maxtext_process.py, HUGE_PAGES_TUNABLE): the train
stage on the tiny recipe with glibc's malloc asking for transparent huge pages (the default)
against without (GLIBC_TUNABLES=glibc.malloc.hugetlb=0), side by side.

    python -m bench.malloc               # ~6 minutes
    python -m bench.malloc --rounds 3

In one fresh project copy (inputs built and the train step compiled once, untimed), the
train stage runs from an empty working directory `rounds` times each way, alternating which
goes first. Reported, medians: the stage's wall time, its CPU time (user + system, every
process of the stage: the getrusage of the waited-for children) and the page faults taken.
Every run's losses must be the same, step by step: nothing computed differs.
"""

import resource
import shutil
import sys
from pathlib import Path

from bench.common import Row, log, median, new_workspace, run_alone, timed  # noqa: E402
from testkit.workspace import train_losses

OFF = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}


def train_once(root: Path, extra_env: dict) -> dict:
    """The train stage from an empty working directory: wall, CPU and system seconds, faults."""
    shutil.rmtree(root / ".scratch", ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = timed([sys.executable, "-m", "stages.train"], root, extra_env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    losses = tuple(sorted(train_losses(root).items()))  # {step: loss as logged}, hashable
    return {
        "wall": run.seconds,
        "cpu": user + system,
        "system": system,
        "faults": after.ru_minflt - before.ru_minflt,
        "losses": losses,
    }


def bench(work: Path, rounds: int = 2) -> list[Row]:
    root = new_workspace(work / "malloc")
    timed(["dvc", "repro", "-q", "convert_in", "token_lengths"], root)
    train_once(root, {})  # compiles the train step into the workspace's cache: every timed run reads it
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for i in range(rounds):
        for label in ("on", "off") if i % 2 == 0 else ("off", "on"):
            log(f"malloc: train, huge pages {label} (round {i + 1} of {rounds})")
            runs[label].append(train_once(root, {} if label == "on" else OFF))
    medians = {
        label: {k: median([r[k] for r in found]) for k in ("wall", "cpu", "system", "faults")}
        for label, found in runs.items()
    }
    on, off = medians["on"], medians["off"]
    same = len({r["losses"] for found in runs.values() for r in found}) == 1
    notes = [f"every run's losses identical, step by step: {'yes' if same else 'NO'}"]
    notes += [
        f"huge pages {label}: wall {m['wall']:.1f}, cpu {m['cpu']:.1f}, system {m['system']:.1f} s; "
        f"{m['faults']:,.0f} page faults"
        for label, m in medians.items()
    ]
    return [
        Row(
            "16. huge pages for malloc: train stage CPU time (user + system), on vs off (tiny)",
            f"{on['cpu']:.1f} s",
            f"{off['cpu']:.1f} s",
            f"{on['cpu'] / off['cpu']:.2f}x",
            "< 1x, same losses",
            "met" if on["cpu"] < off["cpu"] and same else "MISSED",
            notes,
        ),
        Row(
            "16b. huge pages for malloc: train stage wall time, on vs off (tiny)",
            f"{on['wall']:.1f} s",
            f"{off['wall']:.1f} s",
            f"{on['wall'] / off['wall']:.2f}x",
            "info",
            "info",
        ),
        Row(
            "16c. huge pages for malloc: page faults, on vs off (tiny train stage)",
            f"{on['faults']:,.0f}",
            f"{off['faults']:,.0f}",
            f"{on['faults'] / off['faults']:.3f}x",
            "info",
            "info",
        ),
    ]


if __name__ == "__main__":
    run_alone("malloc", bench, rounds=2)
