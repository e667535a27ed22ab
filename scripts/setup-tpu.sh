#!/usr/bin/env bash
# On a Cloud TPU VM: creates .venv with MaxText's supported TPU set, maxtext[tpu-post-train]
# (jax[tpu] + libtpu, Tunix, a CPU torch from the PyTorch index), plus this project's own
# dependencies (DVC with GCS support), at the versions the CPU set uses
# (requirements/shared-pins.txt).
#
#   scripts/setup-tpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  py=$(command -v python3.12 || true)
  [ -n "$py" ] || { echo "error: Python 3.12 not found; install it (e.g. sudo apt-get install python3.12-venv, or pyenv install 3.12)" >&2; exit 1; }
  "$py" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check "uv==0.13.9"
# torch==2.11.0+cpu (what maxtext[tpu-post-train] pins) is served only by the PyTorch index.
.venv/bin/python -m uv pip install --python .venv/bin/python \
  -r pyproject.toml --extra tpu \
  --constraint requirements/shared-pins.txt \
  --override requirements/overrides.txt \
  --extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match
echo "setup-tpu: done. Next: source .venv/bin/activate && export HF_TOKEN=... && dvc repro"
