#!/usr/bin/env bash
# The whole suite on both stores side by side: SQLite, and PostgreSQL (CHATBOX_TEST_STORE;
# tests/pg.py starts its server). Much of a pass waits on the servers it starts, so the two
# together take less than one after the other. Each pass's output is printed when both end;
# the exit status is non-zero when either fails.
#   bash scripts/test.sh [pytest arguments ...]
set -uo pipefail
cd "$(dirname "$0")/.."
# Bytecode for every `chatbox` process the tests start (with PYTHONDONTWRITEBYTECODE set,
# each would otherwise compile the package again: ~0.4 s of every CLI call and server start).
.venv/bin/python -m compileall -q chatbox >/dev/null
logs=$(mktemp -d)
.venv/bin/python -m pytest -q -p no:cacheprovider "$@" >"$logs/sqlite" 2>&1 &
sqlite=$!
CHATBOX_TEST_STORE=postgresql .venv/bin/python -m pytest -q -p no:cacheprovider "$@" \
  >"$logs/postgresql" 2>&1 &
postgresql=$!
failed=0
for store in sqlite postgresql; do
  wait "${!store}" || failed=1
  printf '\n\033[1m== %s\033[0m\n' "$store"
  cat "$logs/$store"
done
rm -rf "$logs"
exit $failed
