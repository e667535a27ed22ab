#!/usr/bin/env bash
# The whole pipeline on the tiny recipe, on this machine's CPU, offline (~7 minutes):
#
#   scripts/demo.sh
#
# Builds .venv if needed, switches params.yaml to the tiny recipe and runs `dvc repro`.
# Outputs: models/sft-hf (the fine-tuned HF checkpoint), metrics/, plots/. Run it again and
# nothing re-runs; edit params.yaml (or `dvc exp run -S train.steps=60`) and only the
# affected stages do.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
source .venv/bin/activate
python -m stages.recipe tiny
# No cloud account needed: the demo's DVC remote is a local directory, set in
# .dvc/config.local (which git ignores). For real use, point the committed gcs remote at
# your bucket instead (README, "Remote").
if ! dvc remote list --local | grep -q '^demo'; then
  dvc remote add --local --default demo "$PWD/.cache/dvc-remote"
fi
dvc repro "$@"
python -m stages.remote push
echo
echo "demo: done. The fine-tuned model is in models/sft-hf (and in the demo remote, .cache/dvc-remote); metrics:"
dvc metrics show
