"""The server end to end with ``--device cuda --compile`` (decode steps replayed from CUDA graphs).

A tiny random Llama saved as a model folder with SmolLM2's tokenizer: every strategy answers through
the HTTP API (completions and chat, streamed and not, structured output, watermark detection), the
KV cache is empty again when the server idles, and the process's GPU memory does not grow from one
burst of requests to the next (nvidia-smi's per-process figure, where nvidia-smi answers).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.engine_harness import tiny_llama
from tests.gpu.device import DEVICE
from tests.test_e2e_openai import start_server, stop_server

STRATEGIES = {
    "greedy": {"temperature": 0},
    "sampling": {"temperature": 0.8, "top_p": 0.9, "seed": 5},
    "beam": {"num_beams": 3, "temperature": 0},
    "contrastive": {"penalty_alpha": 0.6, "top_k": 4, "temperature": 0},
    "dola": {"dola_layers": "high", "temperature": 0},
    "prompt_lookup": {"prompt_lookup_num_tokens": 3, "temperature": 0},
    "early_exit": {"assistant_early_exit": 1, "temperature": 0},
    "n2": {"n": 2, "temperature": 0.7, "seed": 1},
    "watermark": {"watermarking_config": {"greenlist_ratio": 0.25, "bias": 2.0}, "temperature": 0.7, "seed": 2},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tokenizer):
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama(len(tokenizer), seed=1, num_layers=4).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    base, proc = start_server("--model", str(folder), "--device", DEVICE, "--compile", "--max-model-len", "512",
                              "--kv-cache-memory", "64MiB")  # fmt: skip
    yield base, proc
    stop_server(proc)


def completion(base: str, prompt: str, **knobs: object) -> dict:
    reply = httpx.post(f"{base}/v1/completions", json={"prompt": prompt, "max_tokens": 16, **knobs}, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_strategy_answers(server, strategy):
    base, _ = server
    body = completion(server[0], "The capital of France is the capital of France is", **STRATEGIES[strategy])
    assert len(body["choices"]) == STRATEGIES[strategy].get("n", 1)
    assert body["usage"]["completion_tokens"] > 0


def test_chat_streamed_and_a_json_schema(server):
    base, _ = server
    with httpx.stream("POST", f"{base}/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12, "stream": True}) as reply:  # fmt: skip
        assert reply.status_code == 200
        events = [line for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) > 2
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"],
              "additionalProperties": False}  # fmt: skip
    reply = httpx.post(f"{base}/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "A city?"}], "max_tokens": 40,
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}})  # fmt: skip
    assert reply.status_code == 200, reply.text
    assert set(json.loads(reply.json()["choices"][0]["message"]["content"])) == {"city"}


def gpu_memory_mib(pid: int) -> int | None:
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout  # fmt: skip
    for line in out.splitlines():
        found, used = (part.strip() for part in line.split(","))
        if found == str(pid):
            return int(used)
    return None


def burst(base: str) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: completion(base, f"Request {i} says", seed=i, temperature=0.9, max_tokens=40),
                      range(32)))  # fmt: skip


def test_idle_leaves_nothing_behind(server):
    base, proc = server
    burst(base)
    first = gpu_memory_mib(proc.pid)
    burst(base)
    second = gpu_memory_mib(proc.pid)
    metrics = httpx.get(f"{base}/metrics", timeout=10).text
    usage = [line for line in metrics.splitlines() if line.startswith("decoda_kv_cache_usage_perc")]
    assert usage and float(usage[0].split()[-1]) == 0.0, usage
    print(f"\nGPU memory of the server after one burst {first} MiB, after the next {second} MiB")
    if first is not None and second is not None:
        assert second <= first
