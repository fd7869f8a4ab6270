#!/usr/bin/env bash
# Issue 43's one GPU run: tests/gpu, then loadtests/gpu_bench.py, results in one folder, in under ten
# minutes. A GPU machine here has torch, transformers, tokenizers, safetensors, httpx, pytest and
# prometheus-client but no network: what else Decoda (and `transformers serve`) needs travels as
# wheels in .whl/, and the tokenizers and configs in .gpu/ (both git-ignored). Prepare them here:
#
#   loadtests/gpu_check.sh --prepare     # downloads the wheels, saves SmolLM2's and Gemma 3's
#                                        # tokenizer and config from the embedded models
#   loadtests/gpu_check.sh OUT_DIR       # on the GPU machine (the device tool carries .whl and .gpu)
#
# Env: TESTS_TIMEOUT (s, default 240), BENCH_TIMEOUT (default 300), BENCH_ARGS (extra gpu_bench flags),
# SKIP_TESTS=1, SKIP_BENCH=1.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--prepare" ]; then
  set -e
  mkdir -p .whl .gpu
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_31_x86_64 -d .whl \
    transformers==5.23.0 tokenizers==0.23.3 huggingface_hub==2.4.0 fastapi==0.165.0 starlette==1.10.0 \
    uvicorn==0.54.0 sse-starlette==3.7.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 \
    typing-inspection==0.4.5 llguidance==1.9.1 gguf==0.19.0 openai==3.57.0 jiter==0.19.0 distro==1.9.0 \
    sniffio==1.3.1 typing_extensions==4.16.0 annotated-doc==0.0.7 typer==0.29.2 asyncpg==0.32.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 opentelemetry-api==1.45.2 python-multipart==0.0.34
  .venv/bin/python - <<'PY'
import tarfile
from pathlib import Path
from decoding.model.loading import load_model
for name, packaged in (("smollm2", "smollm2-135m-instruct"), ("gemma3", "gemma3-270m")):
    loaded = load_model(packaged, attn_implementation="sdpa")
    loaded.model.config.save_pretrained(f".gpu/{name}-config")
    loaded.tokenizer.save_pretrained(f".gpu/{name}-tokenizer")
with tarfile.open(".gpu/gemma3-tokenizer.tar.xz", "w:xz") as archive:  # 33 MB of JSON: 6 MB travels
    archive.add(".gpu/gemma3-tokenizer", arcname="gemma3-tokenizer")
PY
  rm -rf .gpu/gemma3-tokenizer
  du -sh .whl .gpu
  exit 0
fi

OUT=${1:-${OUT:-/tmp/gpu-check}}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export DECODA_GPU_TOKENIZER=$PWD/.gpu/smollm2-tokenizer
{
  nvidia-smi
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
  nproc; grep -m1 'model name' /proc/cpuinfo
} > "$OUT/device.txt" 2>&1
tail -3 "$OUT/device.txt"
if [ -z "${SKIP_TESTS:-}" ]; then
  echo "== tests/gpu"
  # three processes: a device-side assert poisons its process's CUDA context, not the next one's
  for part in "tests/gpu/test_engine_cuda.py -k not(graphs)" "tests/gpu/test_engine_cuda.py -k graphs" \
              "tests/gpu/test_server_cuda.py" "tests/gpu/test_edges_cuda.py"; do
    set -- $part
    echo "== pytest $part" >> "$OUT/tests.log"
    timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -q -rs -p no:cacheprovider "$@" >> "$OUT/tests.log" 2>&1
    echo "pytest $part: exit $?"
    grep -E "(passed|failed|error).* in " "$OUT/tests.log" | tail -1
  done
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  echo "== loadtests/gpu_bench.py"
  timeout "${BENCH_TIMEOUT:-300}" python3 -m loadtests.gpu_bench --out "$OUT" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
  echo "bench exit $?"
  tail -25 "$OUT/bench.log"
fi
