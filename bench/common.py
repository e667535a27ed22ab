"""What the benchmarks share: fresh copies of the project, timed commands, peak memory, rows.

Every benchmark compares a measurement with a baseline taken in the same run, on the same
machine, alternating which goes first, and reports medians (bench/run.py prints the table).
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from testkit.workspace import copy_project, env, stages_run  # noqa: F401  (the benchmarks' workspaces: the tests' own)

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Timed:
    seconds: float
    output: str
    # Peak resident memory per process kind seen while it ran (bytes): MaxText children by the
    # entry point they run, other processes by their script or module.
    peak_rss: dict[str, int] = field(default_factory=dict)


def timed(cmd: list[str], cwd: Path, extra_env: dict | None = None, sample_rss: bool = False) -> Timed:
    """Runs cmd to completion; raises with the end of its output if it fails."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env(**(extra_env or {})), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.extend(proc.stdout), daemon=True)
    reader.start()
    peaks: dict[str, int] = {}
    while sample_rss and proc.poll() is None:
        for name, rss in tree_rss(proc.pid):
            peaks[name] = max(peaks.get(name, 0), rss)
        time.sleep(0.1)  # the end is seen up to 0.1 s late: fine for the minutes-long runs sampled
    proc.wait()
    seconds = time.perf_counter() - started
    reader.join()
    output = "".join(chunks)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {proc.returncode} in {cwd}:\n{output[-4000:]}")
    return Timed(seconds, output, peaks)


def tree_rss(pid: int) -> list[tuple[str, int]]:
    """(kind, RSS) of a process and its descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    found = []
    for p in procs:
        try:
            argv = p.cmdline()
            kind = (
                argv[argv.index("stages.in_maxtext.main") + 1]
                if "stages.in_maxtext.main" in argv
                else " ".join(argv[:3])
            )
            found.append((kind, p.memory_info().rss))
        except (psutil.Error, IndexError):
            pass
    return found


def stage_seconds(output: str) -> dict[str, float]:
    """Per stage (and per MaxText run inside a stage) the time its own `done in` line reports."""
    times = {}
    for stage, module, seconds in re.findall(r"^([\w.]+): (?:(\S+) )?done in ([\d.]+) s$", output, re.M):
        times[f"{stage}:{module}" if module else stage] = float(seconds)
    return times


def new_workspace(path: Path, recipe: str = "tiny") -> Path:
    """A fresh copy of the project in `path`: its own git repository, DVC cache and (empty)
    JAX compilation cache, so nothing compiled by another run is reused."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return copy_project(path, recipe, compile_cache=path / ".cache" / "jax")


def du(*paths: Path) -> int:
    """Bytes on disk under paths, each hard-linked file counted once (like `du -s a b`)."""
    seen, total = set(), 0
    for path in (f for top in paths for f in files(top)):
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def files(top: Path) -> list[str]:
    """top itself if it is a file, else every file under it (nothing if it does not exist)."""
    if top.is_file():
        return [str(top)]
    return [os.path.join(d, name) for d, _, names in os.walk(top) for name in names]


def evict(path: Path) -> None:
    """Drops a file tree's pages from the page cache, so the next read comes from disk."""
    for name in files(path):
        fd = os.open(name, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_all(path: Path) -> float:
    """Seconds to read every byte under path (the baseline for anything that streams a checkpoint)."""
    started = time.perf_counter()
    for name in files(path):
        with open(name, "rb", buffering=0) as f:
            while f.read(16 << 20):
                pass
    return time.perf_counter() - started


def median(values: list[float]) -> float:
    return statistics.median(values)


GB = 1e9
GIB = 1 << 30


@dataclass
class Row:
    """One line of the table: `value` measured against `baseline` in the same run."""

    name: str
    value: str
    baseline: str
    ratio: str
    target: str
    verdict: str  # "met", "MISSED: why", or "info" for rows kept for regression tracking
    notes: list[str] = field(default_factory=list)


def table(rows: list[Row]) -> str:
    """The rows as a markdown table, followed by their notes."""
    lines = ["| benchmark | measured | baseline | ratio | target | verdict |", "|---|---|---|---|---|---|"]
    lines += [f"| {r.name} | {r.value} | {r.baseline} | {r.ratio} | {r.target} | {r.verdict} |" for r in rows]
    notes = [f"- {r.name}: {note}" for r in rows for note in r.notes]
    return "\n".join(lines) + ("\n\nNotes:\n" + "\n".join(notes) if notes else "")


def run_alone(name: str, bench, **options: int) -> None:
    """A benchmark module's main(): `--option N` for each keyword, a temporary directory,
    `bench(work, **options)`, its table."""
    parser = argparse.ArgumentParser()
    for option, default in options.items():
        parser.add_argument(f"--{option}", type=int, default=default)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-", dir=os.environ.get("BENCH_TMP")) as work:
        print(table(bench(Path(work), **vars(args))))


def verdict(ok: bool, why_not: str = "") -> str:
    return "met" if ok else f"MISSED{': ' + why_not if why_not else ''}"


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
