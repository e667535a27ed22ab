#!/usr/bin/env bash
# The steps of a session on this workplace's chip machine: no network, 64 MiB carried in a call
# (a path carried in one call is gone in the next; /tmp and the checkout's ignored paths stay while
# the machine is warm), files back only from $OUT. On a TPU VM that reaches a bucket none of this
# is needed: `dvc pull` and `dvc repro` (docs/tpu-vm.md).
#
#   bench/chip_steps.sh take NAME       # the carried .chip/NAME/* kept in /tmp/chip/NAME (a piece a call)
#   bench/chip_steps.sh install         # /tmp/chip/bundle (tools/tpu_bundle.py) -> .venv, checked, offline
#   bench/chip_steps.sh unpack          # /tmp/chip/inputs (bench/chip_handoff.py) -> the checkout
#   bench/chip_steps.sh stage NAME...   # python -m stages.NAME for each, in the chip's environment
#   bench/chip_steps.sh run CMD...      # any command in that environment
#
# Every call ends by keeping what the stages wrote outside the ignored paths (metrics/, eval/,
# dvclive*/: the copy of the checkout a call gets may not hold them) in /tmp/chip/keep, restored
# first by the next, and by leaving them, with the logs, in $OUT/results.tar.gz.
set -euo pipefail
cd "$(dirname "$0")/.."
KEEP=/tmp/chip/keep
mkdir -p "$KEEP"
[ -z "$(ls -A "$KEEP")" ] || cp -r "$KEEP"/. .
finish() {
  for d in metrics eval dvclive dvclive-preference; do [ -d "$d" ] && cp -r "$d" "$KEEP"/; done
  if [ -n "${OUT:-}" ]; then
    tar czf "$OUT/results.tar.gz" --ignore-failed-read metrics eval dvclive dvclive-preference logs data/self-pairs \
      data/constraints/heldout.jsonl 2>/dev/null || true
  fi
}
trap finish EXIT
command=$1
shift
case "$command" in
  take)
    mkdir -p "/tmp/chip/$1"
    cp ".chip/$1"/* "/tmp/chip/$1/"
    echo "chip_steps: /tmp/chip/$1 holds $(ls "/tmp/chip/$1" | wc -l) files"
    ;;
  install) python3 -m tools.tpu_bundle install /tmp/chip/bundle ;;
  unpack) python3 bench/chip_handoff.py unpack /tmp/chip/inputs ;;
  stage)
    for name in "$@"; do
      PYTHONUNBUFFERED=1 bench/chip_env.sh python -m "stages.$name"
    done
    ;;
  run) PYTHONUNBUFFERED=1 bench/chip_env.sh "$@" ;;
  *) echo "chip_steps: take NAME | install | unpack | stage NAME... | run CMD..." >&2; exit 2 ;;
esac
