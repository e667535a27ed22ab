#!/usr/bin/env bash
# The test suite: real MaxText on CPU with the tiny models and a real Gemma 3, real DVC, real
# GCS protocol (how long each layer takes: docs/benchmarks.md; the layers: docs/testing.md).
#
#   scripts/test.sh                 # everything, two workers
#   scripts/test.sh -m "not slow"   # the fast layer only
#
# Builds .venv (and the browser check's Chromium + node packages) if needed. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/setup-browser.sh
# Two workers for these 2-core machines: a pipeline test spends much of its time in
# single-threaded work (imports, DVC, Python loops), so two keep both cores busy. Each test
# file runs whole on one worker, longest first (tests/conftest.py); `-n 0` runs in-process.
# Two workers on two cores run torch beside MaxText most of the time. torch's OpenMP threads
# spin while they wait for work, taking the core from the other worker: the small recipe's
# benchmark stage beside one busy process took 367 s spinning, 187 s with them sleeping
# (docs/benchmarks.md, "The test suite"). Same threads, same numbers; only the waiting changes.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
exec .venv/bin/python -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadscope --no-loadscope-reorder "$@"
