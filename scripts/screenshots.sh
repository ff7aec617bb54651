#!/usr/bin/env bash
# Refresh the docs' screenshots (docs/screenshots/*.png) on purpose: the browser tests that
# take them, with their screenshots pointed at docs/screenshots. A plain test run writes its
# screenshots to a temporary directory and never touches tracked files.
#   bash scripts/screenshots.sh            # then review and commit the changed PNGs
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export CHATBOX_SCREENSHOTS="$PWD/docs/screenshots"
mkdir -p "$CHATBOX_SCREENSHOTS"
"$PY" -m pytest -q -m browser \
  tests/web/test_console_browser.py \
  tests/web/test_teams_browser.py \
  tests/cluster/test_replica_console_browser.py
git status --short docs/screenshots
