"""custom_generate through a real ``decoda serve``: SSE streaming, equality with transformers, and the batch
around it (other requests resume; a disconnect stops the job)."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from tests.test_custom_generate import LEFT_PADDING, LOOKAHEAD, hf_custom
from tests.test_e2e_openai import start_server, stop_server


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):  # smollm2: the model is converted into the cache before the server starts
    log = tmp_path_factory.mktemp("custom") / "server.log"
    base, proc = start_server(
        "--max-model-len", "512", "--num-threads", "1", "--custom-generate", f"left_padding={LEFT_PADDING}",
        "--custom-generate", f"lookahead={LOOKAHEAD}", "--trust-remote-code", log=log,
    )  # fmt: skip
    yield base
    stop_server(proc)


def stream(base: str, body: dict, stop_after: int | None = None) -> tuple[list[dict], bool]:
    """The SSE chunks of one streamed completion, and whether ``[DONE]`` came; ``stop_after`` chunks: disconnect."""
    chunks: list[dict] = []
    with httpx.stream("POST", f"{base}/v1/completions", json={**body, "stream": True}, timeout=600) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return chunks, True
            chunks.append(json.loads(line[len("data: ") :]))
            if stop_after is not None and len(chunks) >= stop_after:
                return chunks, False
    return chunks, False


def test_listing(server):
    data = httpx.get(f"{server}/v1/custom_generate", timeout=60).json()["data"]
    assert {(m["id"], tuple(m["arguments"])) for m in data} == {
        ("left_padding", ("left_padding", "pad_token")),
        ("lookahead", ("lookahead_top_k",)),
    }


def test_streamed_answer_equals_hf_generate_while_a_greedy_request_shares_the_server(server, smollm2):
    prompt = smollm2.tokenizer.encode("The three primary colors are")
    greedy_body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    alone = httpx.post(f"{server}/v1/completions", json=greedy_body, timeout=600).json()["choices"][0]
    results: dict[str, dict] = {}

    def greedy() -> None:
        results["greedy"] = httpx.post(f"{server}/v1/completions", json=greedy_body, timeout=600).json()

    thread = threading.Thread(target=greedy)
    thread.start()
    body = {"prompt": prompt, "max_tokens": 6, "custom_generate": "lookahead", "lookahead_top_k": 3,
            "return_token_ids": True}  # fmt: skip
    chunks, done = stream(server, body)
    thread.join(600)
    assert done
    streamed_ids = [t for c in chunks for t in c["choices"][0].get("token_ids") or []]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    expected = hf_custom(smollm2.model, LOOKAHEAD, prompt, 6, list(smollm2.eos_token_ids), lookahead_top_k=3)
    assert streamed_ids == expected
    assert text == smollm2.tokenizer.decode(expected, skip_special_tokens=True)
    assert len([c for c in chunks if c["choices"][0]["text"]]) > 1, "streamed token by token, not in one piece"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    other = results["greedy"]["choices"][0]
    assert other["token_ids"] == alone["token_ids"] and other["finish_reason"] == alone["finish_reason"]


def test_a_disconnect_stops_the_job_and_the_server_serves_on(server):
    body = {"prompt": "Write a long story.", "max_tokens": 400, "custom_generate": "left_padding", "left_padding": 2,
            "pad_token": 0, "ignore_eos": False}  # fmt: skip
    chunks, done = stream(server, body, stop_after=2)
    assert not done and chunks
    after = httpx.post(f"{server}/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "temperature": 0},
                       timeout=600)  # fmt: skip
    assert after.status_code == 200
    metrics = httpx.get(f"{server}/metrics", timeout=60).text
    assert 'decoda_request_success_total{finished_reason="abort",strategy="custom"} 1.0' in metrics


def test_an_unknown_argument_is_a_400_naming_it(server):
    r = httpx.post(
        f"{server}/v1/completions", json={"prompt": "Hi", "custom_generate": "lookahead", "top_kk": 3}, timeout=60
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "top_kk"
