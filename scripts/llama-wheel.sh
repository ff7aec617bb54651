#!/usr/bin/env bash
# The llama-cpp-python wheel chatbox runs: the pinned sdist (checked against its hash), with
# scripts/patches/*.patch applied to its vendored llama.cpp, compiled with CMAKE_ARGS.
#   scripts/llama-wheel.sh flavour     # the wheel's cache key: 10 hex digits of the sha1 of the
#                                      # version, CMAKE_ARGS and the patches
#   scripts/llama-wheel.sh build DIR   # compile it into DIR (5-10 minutes on 2 cores)
# Used by scripts/setup.sh, scripts/image-test.sh and the Dockerfile, so all three build and
# find the same wheel.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
LLAMA_VERSION=0.3.36
LLAMA_SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# A native build (-march=native) segfaults in llama_decode on multi-token batches on some
# machines; a portable AVX2 build works everywhere we run. GPU users override CMAKE_ARGS.
CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON}"
PYTHON="${PYTHON:-python3}"

case "${1:-}" in
  flavour)
    { printf '%s\n%s\n' "$LLAMA_VERSION" "$CMAKE_ARGS"; cat "$HERE"/patches/*.patch; } \
      | sha1sum | cut -c1-10
    ;;
  build)
    out="${2:?usage: $0 build DIR}"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    $PYTHON -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_VERSION" -d "$work"
    sdist="$work/llama_cpp_python-$LLAMA_VERSION.tar.gz"
    echo "$LLAMA_SDIST_SHA256  $sdist" | sha256sum -c --quiet
    tar xzf "$sdist" -C "$work"
    src="$work/llama_cpp_python-$LLAMA_VERSION"
    for p in "$HERE"/patches/*.patch; do
      patch -s -p1 -d "$src" < "$p"
    done
    mkdir -p "$out"
    CMAKE_ARGS="$CMAKE_ARGS" $PYTHON -m pip wheel -q --no-deps "$src" -w "$out"
    ;;
  *)
    sed -n '2,8p' "$0" >&2
    exit 2
    ;;
esac
