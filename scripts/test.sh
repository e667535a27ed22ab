#!/usr/bin/env bash
# The test suite: real MaxText on CPU with the tiny model, real DVC, real GCS protocol.
#
#   scripts/test.sh            # everything (~50-60 minutes on 2 cores)
#   scripts/test.sh -m "not slow"   # the fast tests only (~2 minutes)
#
# Builds .venv (and the browser check's Chromium + node packages) if needed. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/setup-browser.sh
exec .venv/bin/python -m pytest "$@"
