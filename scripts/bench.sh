#!/usr/bin/env bash
# The benchmark suite (its run time: docs/benchmarks.md; ~20 GB of free disk): prints a table of
# measurements, each against a baseline taken in the same run. See bench/run.py.
#
#   scripts/bench.sh                                  # print the table
#   scripts/bench.sh --markdown docs/benchmarks.md    # ... and record it
#   scripts/bench.sh --list                           # what each benchmark measures (the fast test layer runs it)
#
# Builds .venv if needed. Extra arguments go to python -m bench.run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m bench.run "$@"
