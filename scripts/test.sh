#!/usr/bin/env bash
# The test suite: real MaxText on CPU with the tiny model, real DVC, real GCS protocol.
#
#   scripts/test.sh            # everything (~25 minutes on 2 cores)
#   scripts/test.sh -m "not slow"   # the fast tests only (~1 minute)
#
# Builds .venv if needed. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
