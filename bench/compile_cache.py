"""JAX's persistent compilation cache (runtime.compile_cache_dir): time to the first training
step with the cache warm against cold, on the tiny recipe.

    python -m bench.compile_cache    # ~5 minutes

In one fresh project copy (inputs built untimed), the train stage runs three times from an
empty working directory, in this order: with an empty cache (cold: MaxText compiles the train
step and writes it to the cache); again, unchanged (warm: the same program, read from the
cache), as a re-run after a failed export gate or a resumed run does; and with another
learning rate (a different compiled program: the schedule's constants are in it, so the cache
misses and it compiles again). Step 1's time (`perf/step_time_seconds` in MaxText's metrics)
holds the compile; the stage's wall time holds the rest of the start-up too.
"""

import json
import sys
from pathlib import Path

from bench.common import Row, log, new_workspace, run_alone, timed  # noqa: E402


def train_once(root: Path) -> dict:
    """The train stage from an empty working directory: its wall time and step 1's."""
    import shutil

    shutil.rmtree(root / ".scratch", ignore_errors=True)
    run = timed([sys.executable, "-m", "stages.train"], root)
    step_times = (root / "dvclive" / "plots" / "metrics" / "train" / "step_time_s.tsv").read_text().splitlines()
    first = float(step_times[1].split("\t")[1])
    return {"wall": run.seconds, "step1": first}


def cache_entries(cache: Path) -> int:
    return sum(1 for p in cache.rglob("*") if p.is_file())


def bench(work: Path) -> list[Row]:
    from testkit.workspace import set_param

    root = new_workspace(work / "compile-cache")
    cache = root / ".cache" / "jax"
    timed(["dvc", "repro", "-q", "convert_in", "token_lengths"], root)
    found = {}
    for label, lr in (("cold", None), ("warm", None), ("learning rate changed", 2e-3)):
        if lr is not None:
            set_param(root, "train.learning_rate", lr)
        before = cache_entries(cache)
        log(f"compile_cache: train, {label} ({before} cache entries)")
        found[label] = {**train_once(root), "new_entries": cache_entries(cache) - before}
    cold, warm, changed = found["cold"], found["warm"], found["learning rate changed"]
    notes = [
        f"{label}: stage {f['wall']:.1f} s, step 1 {f['step1']:.1f} s, {f['new_entries']} new cache entries"
        for label, f in found.items()
    ]
    return [
        Row(
            "15. compile cache: time to step 1, warm vs cold (tiny)",
            f"{warm['step1']:.1f} s",
            f"{cold['step1']:.1f} s",
            f"{warm['step1'] / cold['step1']:.2f}x",
            "info",
            "info",
            notes,
        ),
        Row(
            "15b. compile cache: train stage wall, warm vs cold (tiny)",
            f"{warm['wall']:.1f} s",
            f"{cold['wall']:.1f} s",
            f"{warm['wall'] / cold['wall']:.2f}x",
            "info",
            "info",
        ),
        Row(
            "15c. compile cache: a changed learning rate misses (tiny)",
            f"{changed['step1']:.1f} s",
            f"{cold['step1']:.1f} s",
            f"{changed['step1'] / cold['step1']:.2f}x",
            "~1x (compiles again)",
            "info",
            [json.dumps({k: round(v, 1) for k, v in changed.items()})],
        ),
    ]


if __name__ == "__main__":
    run_alone("compile_cache", bench)
