#!/usr/bin/env bash
# Runs a command with the project's .venv on a TPU machine whose own Python (3.11, an older JAX
# and libtpu, on PYTHONPATH) MaxText 0.2.5 cannot use: that PYTHONPATH would put the machine's
# packages before .venv's, and JAX must load the lock's libtpu, not the machine's.
#
#   bench/chip_env.sh python -m stages.train
set -euo pipefail
cd "$(dirname "$0")/.."
unset PYTHONPATH
libtpu=$(ls .venv/lib/python3.12/site-packages/libtpu/libtpu*.so | head -n 1)
export TPU_LIBRARY_PATH="$PWD/$libtpu"
export PATH="$PWD/.venv/bin:$PATH" VIRTUAL_ENV="$PWD/.venv"
exec "$@"
