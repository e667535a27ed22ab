#!/usr/bin/env bash
# The whole pipeline on this machine's CPU, offline:
#
#   scripts/demo.sh          # the tiny recipe: random tiny Gemma 3, minutes past set-up
#   scripts/demo.sh small    # the real Gemma 3 270M (recipes/small.yaml); times: docs/benchmarks.md
#
# Builds .venv if needed, switches params.yaml to the recipe and runs `dvc repro` (further
# arguments go to it).
# Outputs: models/sft-hf (the fine-tuned HF checkpoint), metrics/, plots/. Run it again and
# nothing re-runs; edit params.yaml (or `dvc exp run -S train.steps=60`) and only the
# affected stages do.
#
# What it changes in this clone: params.yaml (now the demo's recipe; the committed one is the
# 4B TPU recipe), dvc.lock, metrics/, plots/, eval/ and the ignored models/, data/, logs/,
# plus a local DVC remote in .dvc/config.local. `python -m tools.recipe gemma3-4b-v6e-8`
# (or `git checkout params.yaml`) returns to the committed recipe. scripts/test.sh passes
# either way: it runs the pipeline in copies of the project, each switched to the recipe
# its test needs, and checks params.yaml as committed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
source .venv/bin/activate
recipe=tiny
if [ $# -gt 0 ] && [ -f "recipes/$1.yaml" ]; then recipe=$1; shift; fi
python -m tools.recipe "$recipe"
# No cloud account needed: the demo's DVC remote is a local directory, set in
# .dvc/config.local (which git ignores). For real use, point the committed gcs remote at
# your bucket instead (docs/remote.md).
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
echo "  git add dvc.lock params.yaml metrics dvclive dvclive-preference eval && git commit && git push  (docs/remote.md, \"Handing a run over\")"
echo
[ "$recipe" = small ] && echo "demo: base vs fine-tuned, side by side: eval/generations.md" && echo
echo "demo: params.yaml now holds the $recipe recipe. Back to the committed one: python -m tools.recipe gemma3-4b-v6e-8"
