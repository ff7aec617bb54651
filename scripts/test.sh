#!/usr/bin/env bash
# The whole suite on both stores side by side: SQLite, and PostgreSQL (CHATBOX_TEST_STORE;
# tests/pg.py starts its server). Much of a pass waits on the servers it starts, so each pass
# runs its test files in two worker processes (pytest-xdist; a file's tests stay together, so
# its module fixtures are made once), and the two passes run at once. Each pass's output is
# printed when both end; the exit status is non-zero when either fails.
#   bash scripts/test.sh [pytest arguments ...]
#   CHATBOX_TEST_WORKERS=0 bash scripts/test.sh ...   # each pass in one process
set -uo pipefail
cd "$(dirname "$0")/.."
# Bytecode for every `chatbox` process the tests start (with PYTHONDONTWRITEBYTECODE set,
# each would otherwise compile the package again: ~0.4 s of every CLI call and server start).
.venv/bin/python -m compileall -q chatbox >/dev/null
# And the rest written on first import (pytest's rewritten test modules, installed packages
# that came without bytecode, anyio among them): once, not in every process.
unset PYTHONDONTWRITEBYTECODE
logs=$(mktemp -d)
# One cache for both passes' servers (the embedding model's export, moderation's classifiers).
export CHATBOX_TEST_CACHE_DIR="$logs/served-cache"
# The PostgreSQL pass skips what no store can change, so it takes a few store-free files from
# the SQLite pass (HANDED_OVER in tests/conftest.py) and the two end together.
export CHATBOX_TEST_PASSES=both
workers=${CHATBOX_TEST_WORKERS:-2}
spread=()
# --no-loadscope-reorder: files in the suite's order (slowest first, tests/conftest.py), not
# xdist's (most tests first, which left the slow served files with few tests for the end).
[ "$workers" = 0 ] || spread=(-n "$workers" --dist loadfile --no-loadscope-reorder)
.venv/bin/python -m pytest -q -p no:cacheprovider "${spread[@]}" "$@" >"$logs/sqlite" 2>&1 &
sqlite=$!
CHATBOX_TEST_STORE=postgresql .venv/bin/python -m pytest -q -p no:cacheprovider "${spread[@]}" \
  "$@" >"$logs/postgresql" 2>&1 &
postgresql=$!
failed=0
for store in sqlite postgresql; do
  wait "${!store}" || failed=1
  printf '\n\033[1m== %s\033[0m\n' "$store"
  cat "$logs/$store"
done
rm -rf "$logs"
exit $failed
