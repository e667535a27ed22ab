#!/usr/bin/env bash
# The test suite: real MaxText on CPU with the tiny model, real DVC, real GCS protocol.
#
#   scripts/test.sh            # everything (~35 minutes on 2 cores, two workers)
#   scripts/test.sh -m "not slow"   # the fast tests only (~1.5 minutes)
#
# Builds .venv (and the browser check's Chromium + node packages) if needed. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/setup-browser.sh

# Where the tests' workspaces go. A full run writes ~15 GB (checkpoints, DVC caches, exports;
# ~7 GB of it still there at the end), so it goes to memory (tmpfs, /dev/shm) when the machine
# has room for it: the disk then carries only what programs read (a run's writes fell from 8.3
# to 0.6 MB/s, docs/benchmarks.md). PIPELINE_TEST_TMP=DIR chooses the place (kept after the
# run); a tmpfs one is removed after a run that passed, and kept, with its path printed, after
# one that failed.
basetemp=() tmp=""
if [ -n "${PIPELINE_TEST_TMP:-}" ]; then
  basetemp=(--basetemp "$PIPELINE_TEST_TMP")
else
  gib() { echo $(( $1 / 1024 / 1024 )); }  # KiB -> GiB
  available=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
  shm=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')
  if [ -w /dev/shm ] && [ "$(gib "${shm:-0}")" -ge 12 ] && [ "$(gib "$available")" -ge 14 ]; then
    tmp=$(mktemp -d /dev/shm/pipeline-tests.XXXXXX)
    basetemp=(--basetemp "$tmp")
  fi
fi

# Two workers for these 2-core machines: a pipeline test spends much of its time in
# single-threaded work (imports, DVC, Python loops), so two keep both cores busy. Each test
# file runs whole on one worker, longest first (tests/conftest.py); `-n 0` runs in-process.
status=0
.venv/bin/python -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadscope --no-loadscope-reorder "${basetemp[@]}" "$@" || status=$?
if [ -n "$tmp" ]; then
  if [ "$status" = 0 ] || [ "$status" = 5 ]; then
    rm -rf "$tmp"
  else
    echo "scripts/test.sh: the tests' files are kept in $tmp (in memory: rm -rf it when done)" >&2
  fi
fi
exit "$status"
