"""The benchmark suite: every row a measurement against its baseline, taken side by side in one run.

    python -m bench.run                                 # all rows (~31 minutes on 2 cores), prints the table
    python -m bench.run --pipeline-reps 2 --markdown docs/benchmarks.md   # as recorded there (~36 minutes)
    python -m bench.run --only packing,no_change        # some benchmarks
    python -m bench.run --list                          # what each benchmark measures; runs nothing

(scripts/bench.sh builds .venv first, then runs this.) Each benchmark is a module here that
can also run on its own; see its docstring for what exactly is compared. Exit status 1 if
a benchmark failed to run; missed targets are reported in the table, not as failures.
"""

import argparse
import datetime
import importlib.metadata
import os
import platform
import re
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from bench import (
    compile_cache,  # noqa: E402
    conversion,  # noqa: E402
    fail_fast,  # noqa: E402
    malloc,  # noqa: E402
    no_change,  # noqa: E402
    packing,  # noqa: E402
    pipeline,  # noqa: E402
    remote_transfer,  # noqa: E402
    scale,  # noqa: E402
)
from bench.common import GIB, Row, du, log, table  # noqa: E402

BENCHMARKS = (
    "packing",
    "compile_cache",
    "malloc",
    "no_change",
    "fail_fast",
    "scale",
    "pipeline",
    "conversion",
    "remote",
)
MODULES = {"remote": "remote_transfer"}  # a benchmark's module, where its name differs
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
VERSIONS = ("maxtext", "google-tunix", "jax", "transformers", "grain", "dvc", "dvc-gs", "gcsfs")


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} x {cpu}, {mem:.0f} GiB RAM"


def versions() -> str:
    found = [f"Python {platform.python_version()}"]
    for pkg in VERSIONS:
        try:
            found.append(f"{pkg} {importlib.metadata.version(pkg)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return ", ".join(found)


def record(path: Path, text: str) -> None:
    """Replaces the generated part of path (between the bench markers), keeping the rest."""
    block = f"{BEGIN}\n{text}\n{END}"
    if path.exists() and BEGIN in (old := path.read_text()):
        path.write_text(re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, old, flags=re.S))
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Benchmarks\n\n{block}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(BENCHMARKS), help=f"comma-separated, of: {', '.join(BENCHMARKS)}")
    parser.add_argument("--markdown", type=Path, help="record the table in this file (between the bench markers)")
    parser.add_argument(
        "--pipeline-reps",
        type=int,
        default=1,
        help="by-hand / dvc repro pairs for row 1; each pair is ~10 minutes on 2 cores",
    )
    parser.add_argument("--remote-gb", type=float, default=1.0)
    parser.add_argument("--remote-rounds", type=int, default=2)
    parser.add_argument("--list", action="store_true", help="say what each benchmark measures, run nothing")
    args = parser.parse_args()
    if args.list:
        for name in BENCHMARKS:
            module = sys.modules[f"bench.{MODULES.get(name, name)}"]
            print(f"{name:14s} {(module.__doc__ or '').strip().splitlines()[0]}")
        return
    chosen = args.only.split(",")
    unknown = set(chosen) - set(BENCHMARKS)
    if unknown:
        parser.error(f"--only: unknown {', '.join(sorted(unknown))}; choose from {', '.join(BENCHMARKS)}")

    started = time.monotonic()
    rows: list[Row] = []
    failed = []
    runtime_rss = None
    with tempfile.TemporaryDirectory(prefix="bench-", dir=os.environ.get("BENCH_TMP")) as tmp:
        work = Path(tmp)
        runs = {
            "packing": lambda: packing.bench(work),
            "compile_cache": lambda: compile_cache.bench(work),
            "malloc": lambda: malloc.bench(work),
            "no_change": lambda: no_change.bench(work),
            "fail_fast": lambda: fail_fast.bench(work),
            "scale": lambda: scale.bench(work),
            "pipeline": lambda: pipeline.bench_with_runtime_rss(work, args.pipeline_reps),
            "conversion": lambda: conversion.bench(work, runtime_rss=runtime_rss),
            "remote": lambda: remote_transfer.bench(work, args.remote_gb, args.remote_rounds),
        }
        for name in BENCHMARKS:
            if name not in chosen:
                continue
            log(f"{name}: start ({(time.monotonic() - started) / 60:.1f} min in; {du(work) / 1e9:.1f} GB in {work})")
            try:
                result = runs[name]()
            except Exception:
                traceback.print_exc()
                failed.append(name)
                rows.append(Row(f"{name}", "-", "-", "-", "-", "FAILED to run (see the log above)"))
                continue
            if name == "pipeline":
                result, runtime_rss = result
            rows.extend(result)
            for path in list(work.iterdir()):  # disk for the next one
                shutil.rmtree(path, ignore_errors=True)
    rows.sort(key=lambda r: r.name)
    minutes = (time.monotonic() - started) / 60
    command = "python -m bench.run " + " ".join(sys.argv[1:])
    text = (
        f"Measured {datetime.date.today().isoformat()} in {minutes:.0f} minutes on {machine()}.\n"
        f"Versions: {versions()}.\nRegenerate: `{command.strip()}`.\n\n{table(rows)}"
    )
    print("\n" + text)
    if args.markdown:
        record(args.markdown, text)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
