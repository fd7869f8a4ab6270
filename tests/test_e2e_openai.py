"""End to end: a real ``decoda serve`` process with the embedded model, driven by the openai client."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tests.shared_servers import PLAIN, PLAIN_MAX_MODEL_LEN

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(*flags: str, log: Path | None = None, ready_s: float = 120) -> tuple[str, subprocess.Popen]:
    """``decoda serve`` on a free port, ready within ``ready_s``. Its output is a pipe read at the end, or
    the file ``log`` for a server that answers thousands of requests (a full pipe would block its access log)."""
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "server.cli", "serve", "--port", str(port), *flags]
    out = subprocess.PIPE if log is None else log.open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited early:\n{proc.stdout.read() if log is None else log.read_text()}")
        try:
            if httpx.get(f"{base}/ready", timeout=1).status_code == 200:
                return base, proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise AssertionError(f"server did not become ready in {ready_s:g} s")


def stop_server(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def start_servers(*flag_sets: tuple[str, ...]) -> list[tuple[str, subprocess.Popen]]:
    """One ``decoda serve`` per flag set, started side by side (each load and warm-up is mostly one
    core's work); if one fails to start, the others are stopped before the error is raised. Each may
    take as long as the starts one after another would have (they share the machine)."""
    ready_s = 120 * len(flag_sets)
    with ThreadPoolExecutor(len(flag_sets)) as pool:
        futures = [pool.submit(start_server, *flags, ready_s=ready_s) for flags in flag_sets]
    started = [future.result() for future in futures if future.exception() is None]
    failed = [future.exception() for future in futures if future.exception() is not None]
    if failed:
        for _, proc in started:
            stop_server(proc)
        raise failed[0]
    return started


@pytest.fixture(scope="module")
def server(shared_server) -> str:
    """The session's plain server (tests/shared_servers.py); the tests below that need other flags
    (a full queue, draining, an assistant model) start their own."""
    return shared_server(*PLAIN)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def test_models_lists_the_short_name(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_greedy_completion_matches_hf(client, smollm2):
    from tests.engine_harness import hf_greedy

    prompt = "The capital of France is"
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    expected = hf_greedy(smollm2.model, smollm2.tokenizer.encode(prompt), 12)
    assert out.choices[0].text == smollm2.tokenizer.decode(expected, skip_special_tokens=True)
    assert out.usage.completion_tokens == len(expected)
    assert out.choices[0].finish_reason in ("stop", "length")


def test_chat_completion_and_usage(client):
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=16, temperature=0
    )
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_streaming_chat_equals_non_streaming(client):
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Count to five."}], max_tokens=24, temperature=0)
    full = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish and finish[-1] in ("stop", "length")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_seeded_sampling_with_extra_body_knobs_reproduces(client):
    kwargs = dict(
        model=MODEL,
        prompt="Once upon a time",
        max_tokens=16,
        temperature=0.9,
        seed=1234,
        extra_body={"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "return_token_ids": True},
    )
    first = client.completions.create(**kwargs)
    second = client.completions.create(**kwargs)
    assert first.choices[0].text == second.choices[0].text
    assert first.model_extra is not None or first.choices[0].model_extra


def test_stop_string_is_not_in_the_output(client):
    out = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=[" 7"])
    assert " 7" not in out.choices[0].text
    assert out.choices[0].finish_reason == "stop"


def test_beam_search_returns_the_best_n_with_scores_and_streams_the_same(client, smollm2):
    import torch

    messages = [{"role": "user", "content": "Name a color."}]
    beam = {"num_beams": 4, "early_stopping": True, "length_penalty": 0.8}
    kwargs = dict(model=MODEL, messages=messages, max_tokens=16, temperature=0, n=2, extra_body=beam)
    out = client.chat.completions.create(**kwargs, logprobs=True)
    scores = [c.model_extra["sequence_score"] for c in out.choices]
    assert scores == sorted(scores, reverse=True)
    prompt = smollm2.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(prompt if isinstance(prompt, list) else prompt["input_ids"])
    with torch.inference_mode():
        ref = smollm2.model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), max_new_tokens=16,
            num_return_sequences=2, output_scores=True, return_dict_in_generate=True, do_sample=False, **beam,
        )  # fmt: skip
    expected = [smollm2.tokenizer.decode(s[len(prompt) :], skip_special_tokens=True) for s in ref.sequences]
    assert [c.message.content for c in out.choices] == expected
    assert scores == pytest.approx(ref.sequences_scores.tolist(), abs=1e-4)
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    streamed = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
                for i in range(2)]  # fmt: skip
    assert streamed == expected


@pytest.mark.parametrize(
    "knobs",
    [
        {"penalty_alpha": 0.6, "top_k": 4},
        {"dola_layers": "high", "repetition_penalty": 1.2},
        {"num_beams": 4, "num_beam_groups": 2, "diversity_penalty": 1.0},
    ],
    ids=["contrastive", "dola", "diverse-beam"],
)
def test_strategies_transformers_5_removed_are_served_and_stream(client, knobs):
    kwargs = dict(model=MODEL, prompt="The three primary colors are", max_tokens=12, temperature=0, extra_body=knobs)
    full = client.completions.create(**kwargs)
    assert full.choices[0].text and full.usage.completion_tokens > 0
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kwargs, stream=True) if c.choices)
    assert streamed == full.choices[0].text


def test_beam_limits_are_400s(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="hi", temperature=0, extra_body={"num_beams": 9})
    assert err.value.body["param"] == "num_beams"
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="hi", temperature=0, n=3, extra_body={"num_beams": 2})
    assert err.value.body["param"] == "n"


def test_unknown_field_is_a_400_naming_it(server):
    base = server
    r = httpx.post(f"{base}/v1/completions", json={"model": MODEL, "prompt": "hi", "num_beam": 2})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "num_beam"


def test_bad_values_are_400s(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="hi", top_p=1.5)
    assert err.value.body["param"] == "top_p"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi")
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="hello " * (2 * PLAIN_MAX_MODEL_LEN), max_tokens=8)
    assert "context" in err.value.body["message"]


def test_metrics_are_prometheus_text(server, client):
    base = server
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=4, temperature=0)
    text = httpx.get(f"{base}/metrics").text
    assert 'decoda_generation_tokens_total{strategy="greedy"}' in text
    assert "decoda_time_to_first_token_seconds_bucket" in text


def test_client_disconnect_aborts_the_request(server):
    base = server
    body = {"model": MODEL, "prompt": "Tell me a long story.", "max_tokens": 500, "stream": True,
            "ignore_eos": True, "temperature": 0}  # fmt: skip

    def aborted() -> float:
        for line in httpx.get(f"{base}/metrics").text.splitlines():
            if line.startswith('decoda_request_success_total{finished_reason="abort"'):
                return float(line.split()[-1])
        return 0.0

    before = aborted()
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                break  # hang up after the first chunk
    deadline = time.monotonic() + 10
    while aborted() == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert aborted() == before + 1


def test_full_queue_answers_429_with_retry_after(smollm2):
    base, proc = start_server("--max-num-seqs", "1", "--max-queue", "1")
    try:
        body = {"model": MODEL, "prompt": "Count:", "max_tokens": 60, "ignore_eos": True, "temperature": 0}

        def send(_: int) -> httpx.Response:
            return httpx.post(f"{base}/v1/completions", json=body, timeout=120)

        with ThreadPoolExecutor(4) as pool:
            responses = list(pool.map(send, range(4)))
        codes = sorted(r.status_code for r in responses)
        assert 429 in codes and 200 in codes and set(codes) <= {200, 429}, codes
        rejected = next(r for r in responses if r.status_code == 429)
        assert int(rejected.headers["retry-after"]) >= 1
        assert rejected.json()["error"]["type"] == "rate_limit_error"
    finally:
        stop_server(proc)


def test_sigterm_drains_in_flight_requests_then_exits_0(smollm2):
    # a drain deadline no machine's 40 tokens come near: what is tested is that the stream finishes
    base, proc = start_server("--drain-timeout", "600")
    body = {"model": MODEL, "prompt": "Tell me a story.", "max_tokens": 40, "ignore_eos": True, "temperature": 0,
            "stream": True}  # fmt: skip
    chunks = []
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and not chunks:
                proc.send_signal(signal.SIGTERM)  # mid-stream
                assert_stops_admitting(base)
            if line.startswith("data: "):
                chunks.append(line)
    assert chunks[-1] == "data: [DONE]"
    finish = [json.loads(c[6:]) for c in chunks[:-1]][-1]["choices"][0]["finish_reason"]
    assert finish == "length"  # the in-flight request ran to its end
    assert proc.wait(60) == 0


def assert_stops_admitting(base: str, seconds: float = 60) -> None:
    """After SIGTERM, /ready goes red (503 while draining) or the listener closes, however slow the machine."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.get(f"{base}/ready", timeout=5).status_code == 503:
                return
        except httpx.HTTPError:  # the listener is closed
            return
        assert time.monotonic() < deadline, "still admitting after SIGTERM"
        time.sleep(0.05)


def test_speculative_decoding_with_a_preloaded_assistant(smollm2):
    base, proc = start_server("--max-model-len", "512", "--assistant-model", f"draft={MODEL}")
    try:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        models = httpx.get(f"{base}/v1/models").json()["data"]
        assert {(m["id"], m["role"]) for m in models} == {(MODEL, "target"), ("draft", "assistant")}
        prompt = "List the days of the week: Monday, Tuesday,"
        plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
        for knobs in ({"assistant_model": "draft"}, {"prompt_lookup_num_tokens": 5}, {"assistant_early_exit": 10}):
            out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, extra_body=knobs)
            assert out.choices[0].text == plain.choices[0].text, knobs
        with pytest.raises(openai.NotFoundError) as err:
            client.completions.create(model=MODEL, prompt=prompt, temperature=0, extra_body={"assistant_model": "x"})
        assert err.value.body["param"] == "assistant_model"
        metrics = httpx.get(f"{base}/metrics").text
        assert 'decoda_spec_accepted_tokens_total{assistant="draft"}' in metrics
        assert 'decoda_spec_draft_tokens_total{assistant="prompt_lookup"}' in metrics
    finally:
        assert stop_server(proc) == 0


def test_sigterm_past_the_drain_deadline_ends_requests_with_503_not_a_cut_connection(smollm2):
    base, proc = start_server("--drain-timeout", "1")
    body = {"model": MODEL, "prompt": "Tell me a long story.", "max_tokens": 1000, "ignore_eos": True,
            "temperature": 0}  # fmt: skip
    with ThreadPoolExecutor(1) as pool:
        plain = pool.submit(httpx.post, f"{base}/v1/completions", json=body, timeout=60)
        payloads = []
        with httpx.stream("POST", f"{base}/v1/completions", json={**body, "stream": True}, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and not payloads:
                    proc.send_signal(signal.SIGTERM)  # mid-stream; neither request can finish in 1 s
                if line.startswith("data: "):
                    payloads.append(line[len("data: ") :])
        assert payloads[-1] == "[DONE]"
        assert json.loads(payloads[-2])["error"]["code"] == "unavailable"
        rejected = plain.result()
    assert rejected.status_code == 503 and rejected.json()["error"]["code"] == "unavailable"
    assert int(rejected.headers["retry-after"]) >= 1
    assert proc.wait(60) == 0
