#!/usr/bin/env bash
# On a Cloud TPU VM: creates .venv with MaxText's supported TPU set, maxtext[tpu-post-train]
# (jax[tpu] + libtpu, Tunix, a CPU torch from the PyTorch index), plus this project's own
# dependencies (DVC with GCS support), at the versions the CPU set uses
# (requirements/shared-pins.txt).
#
#   scripts/setup-tpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.9
find_uv() { command -v uv || { [ -x "$HOME/.local/bin/uv" ] && echo "$HOME/.local/bin/uv"; } || true; }
if [ ! -x .venv/bin/python ]; then
  # MaxText 0.2.5 needs Python 3.12. The tutorial's image (Ubuntu 22.04) has 3.10 and no 3.12
  # package, so without a python3.12 on PATH, uv provides one, as the tutorial installs it
  # (`uv python install 3.12`: a standalone CPython under ~/.local/share/uv/python).
  py=$(command -v python3.12 || true)
  if [ -z "$py" ]; then
    uv=$(find_uv)
    if [ -z "$uv" ]; then
      echo "setup-tpu: no python3.12 on PATH; installing uv $UV_VERSION to get one"
      python3 -m pip install -q --user "uv==$UV_VERSION" 2>/dev/null \
        || curl -LsSf "https://astral.sh/uv/$UV_VERSION/install.sh" | sh
      uv=$(find_uv)
    fi
    py=$("$uv" python find --managed-python 3.12 2>/dev/null || true)
    if [ -z "$py" ]; then
      "$uv" python install 3.12
      py=$("$uv" python find --managed-python 3.12)
    fi
    echo "setup-tpu: Python 3.12 from uv: $py"
  fi
  "$py" -m venv .venv
fi
# SETUP_TPU_PYTHON_ONLY=1 stops here, with .venv made (tests/test_environment.py checks how
# Python 3.12 is found without installing MaxText's TPU set, which only a TPU VM runs).
[ -z "${SETUP_TPU_PYTHON_ONLY:-}" ] || exit 0
.venv/bin/python -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
# torch==2.11.0+cpu (what maxtext[tpu-post-train] pins) is served only by the PyTorch index.
.venv/bin/python -m uv pip install --python .venv/bin/python \
  -r pyproject.toml --extra tpu \
  --constraint requirements/shared-pins.txt \
  --override requirements/overrides.txt \
  --extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match
echo "setup-tpu: done. Next: source .venv/bin/activate && export HF_TOKEN=... && dvc repro"
