#!/usr/bin/env bash
# The whole pipeline on the tiny recipe, on this machine's CPU, offline (~4 minutes past set-up):
#
#   scripts/demo.sh
#
# Builds .venv if needed, switches params.yaml to the tiny recipe and runs `dvc repro`.
# Outputs: models/sft-hf (the fine-tuned HF checkpoint), metrics/, plots/. Run it again and
# nothing re-runs; edit params.yaml (or `dvc exp run -S train.steps=60`) and only the
# affected stages do.
#
# What it changes in this clone: params.yaml (now the tiny recipe; the committed one is the
# 4B TPU recipe), dvc.lock, metrics/, plots/, eval/ and the ignored models/, data/, logs/,
# plus a local DVC remote in .dvc/config.local. `python -m tools.recipe gemma3-4b-v6e-8`
# (or `git checkout params.yaml`) returns to the committed recipe. scripts/test.sh passes
# either way: it runs the pipeline in copies of the project, each switched to the recipe
# its test needs, and checks params.yaml as committed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
source .venv/bin/activate
python -m tools.recipe tiny
# No cloud account needed: the demo's DVC remote is a local directory, set in
# .dvc/config.local (which git ignores). For real use, point the committed gcs remote at
# your bucket instead (README, "Remote").
if ! dvc remote list --local | grep -q '^demo'; then
  dvc remote add --local --default demo "$PWD/.cache/dvc-remote"
fi
dvc repro "$@"
python -m tools.remote push
echo
echo "demo: done. The fine-tuned model is in models/sft-hf (and in the demo remote, .cache/dvc-remote)."
python -m tools.summary
echo "(every figure: dvc metrics show; the curves: dvc plots show, then open dvc_plots/index.html)"
echo
echo "demo: a real run is handed over with its record: python -m tools.remote push, then"
echo "  git add dvc.lock params.yaml metrics dvclive eval && git commit && git push  (README, \"On a TPU VM\")"
echo
echo "demo: params.yaml now holds the tiny recipe. Back to the committed one: python -m tools.recipe gemma3-4b-v6e-8"
