#!/usr/bin/env bash
# What tests/test_plots.py needs to render `dvc plots show` in a real browser: Debian's
# Chromium, and (tests/browser/package.json) playwright-core plus the vega scripts DVC's page
# loads from a CDN, served locally because the tests run offline.
#
#   scripts/setup-browser.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup-browser: installing Debian's chromium"
    apt-get install -y -q chromium >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }
  else
    echo "setup-browser: chromium missing; install it (sudo apt-get install chromium) for tests/test_plots.py" >&2
  fi
fi
stamp=tests/browser/node_modules/.package-lock.sha256
want=$(sha256sum tests/browser/package-lock.json | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup-browser: npm ci in tests/browser"
  (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error)
  echo "$want" > "$stamp"
fi
