"""HTTP behaviour against a fake engine: OpenAI shapes, SSE framing, every error path."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from server.app import create_app
from server.config.settings import Settings
from tests.fake_engine import FakeEngineClient

MODEL = "fake-model"


def client_for(engine: FakeEngineClient, **settings: object) -> httpx.AsyncClient:
    app = create_app(Settings(**settings), engine_client=engine)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def post(engine: FakeEngineClient, path: str, body: dict, **settings: object) -> httpx.Response:
    async with client_for(engine, **settings) as http:
        return await http.post(path, json=body)


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(coro)


def sse_payloads(text: str) -> list:
    events = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


# ---- happy paths ------------------------------------------------------------------------------------
def test_completion_body_and_usage():
    r = run(post(FakeEngineClient(), "/v1/completions", {"model": MODEL, "prompt": "hello world", "max_tokens": 3}))
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"] == [{"index": 0, "text": "hello world foo", "logprobs": None, "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}


def test_n_and_several_prompts_index_choices_prompt_major():
    engine = FakeEngineClient()
    body = {"model": MODEL, "prompt": ["hello", "hello world foo"], "n": 2, "max_tokens": 1, "temperature": 0.5}
    r = run(post(engine, "/v1/completions", body))
    assert [c["index"] for c in r.json()["choices"]] == [0, 1, 2, 3]
    assert [s[1] for s in engine.submitted] == [[1], [1, 2, 3]]
    assert r.json()["usage"]["completion_tokens"] == 4


def test_openai_temperature_and_hf_knobs_reach_the_engine():
    engine = FakeEngineClient()
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "temperature": 0.7, "top_k": 5, "min_p": 0.1,
            "repetition_penalty": 1.2, "stop": "end", "seed": 3, "min_tokens": 1}  # fmt: skip
    assert run(post(engine, "/v1/completions", body)).status_code == 200
    params = engine.submitted[0][2]
    assert (params.do_sample, params.temperature, params.top_k, params.min_p) == (True, 0.7, 5, 0.1)
    assert (params.repetition_penalty, params.stop, params.seed, params.min_new_tokens) == (1.2, ["end"], 3, 1)
    run(post(engine, "/v1/completions", {"model": MODEL, "prompt": "hi", "temperature": 0}))
    assert engine.submitted[1][2].do_sample is False


def test_completion_logprobs_echo_and_token_ids():
    body = {"model": MODEL, "prompt": "hello world", "max_tokens": 2, "logprobs": 1, "echo": True,
            "return_token_ids": True}  # fmt: skip
    choice = run(post(FakeEngineClient(), "/v1/completions", body)).json()["choices"][0]
    assert choice["text"] == "hello world" + "hello world"
    assert choice["token_ids"] == [1, 2]
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == ["hello", "world", "hello", "world"]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert logprobs["top_logprobs"][2] == {"hello": -0.5}


def test_chat_body_and_logprobs():
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2,
            "logprobs": True, "top_logprobs": 1}  # fmt: skip
    r = run(post(FakeEngineClient(), "/v1/chat/completions", body))
    choice = r.json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "hello world", "refusal": None}
    entry = choice["logprobs"]["content"][0]
    assert entry["token"] == "hello" and entry["bytes"] == list(b"hello")
    assert entry["top_logprobs"][0]["logprob"] == -0.5


def test_chat_stream_framing():
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    payloads = sse_payloads(run(post(FakeEngineClient(), "/v1/chat/completions", body)).text)
    assert payloads[-1] == "[DONE]"
    chunks = payloads[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "hello world"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-2]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2
    assert all(c["usage"] is None for c in chunks[:-1])


def test_completion_stream_without_usage():
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 3, "stream": True}
    payloads = sse_payloads(run(post(FakeEngineClient(), "/v1/completions", body)).text)
    assert payloads[-1] == "[DONE]"
    assert "".join(p["choices"][0]["text"] for p in payloads[:-1]) == "hello world foo"
    assert payloads[-2]["choices"][0]["finish_reason"] == "length"


def test_models_health_ready_metrics():
    async def go():  # noqa: ANN202
        async with client_for(FakeEngineClient()) as http:
            models = (await http.get("/v1/models")).json()
            assert models["data"][0]["id"] == MODEL and models["data"][0]["role"] == "target"
            assert (await http.get("/health")).status_code == 200
            assert (await http.get("/ready")).status_code == 200
            metrics = await http.get("/metrics")
            assert metrics.headers["content-type"].startswith("text/plain")
            from server.http.metrics import METRIC_DOCS

            for name in METRIC_DOCS:  # every documented series is exported, in Prometheus text format
                # prometheus-client names a counter's TYPE line with or without _total by version
                base = name.removesuffix("_total")
                assert f"# TYPE {name} " in metrics.text or f"# TYPE {base} " in metrics.text, name

    run(go())


# ---- errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"num_beam": 2}, "num_beam"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "many"}, "max_tokens"),
        ({"temperature": "hot"}, "temperature"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": [1, 5000]}, "prompt"),
        ({"top_k": 5, "temperature": 0}, "top_k"),
        ({"num_beams": 3, "num_beam_groups": 2}, "num_beam_groups"),
        ({"num_beams": 0}, "num_beams"),
        ({"num_beams": 2, "n": 3}, "n"),
        ({"num_beams": 2, "num_return_sequences": 3}, "num_return_sequences"),
        ({"n": 2, "num_return_sequences": 3}, "num_return_sequences"),
        ({"num_beams": 2, "diversity_penalty": 1.0}, "diversity_penalty"),
        ({"num_beams": 4, "num_beam_groups": 2, "do_sample": True}, "num_beam_groups"),
        ({"num_beams": 2, "early_stopping": "sometimes"}, "early_stopping"),
        ({"dola_layers": "middle"}, "dola_layers"),
        ({"dola_layers": "high", "num_beams": 2}, "dola_layers"),
        ({"dola_layers": "high", "penalty_alpha": 0.5}, "dola_layers"),
        ({"penalty_alpha": 0.6, "top_k": 4}, "penalty_alpha"),
        ({"penalty_alpha": 0.6, "temperature": 0}, "penalty_alpha"),
        ({"penalty_alpha": 0.6, "top_k": 64, "temperature": 0}, "top_k"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"assistant_model": "nope"}, "assistant_model"),
        ({"prompt_lookup_num_tokens": 0}, "prompt_lookup_num_tokens"),
        ({"num_assistant_tokens": 3}, "num_assistant_tokens"),
        ({"max_matching_ngram_size": 2}, "max_matching_ngram_size"),
        ({"assistant_early_exit": 2, "num_beams": 2, "temperature": 0}, "num_beams"),
        ({"prompt_lookup_num_tokens": 3, "penalty_alpha": 0.5, "top_k": 4, "temperature": 0}, "penalty_alpha"),
        ({"assistant_early_exit": 2, "num_assistant_tokens_schedule": "sometimes"}, "num_assistant_tokens_schedule"),
        ({"suffix": "x"}, "suffix"),
    ],
)
def test_bad_parameters_are_400s_naming_the_field(body, param):
    r = run(post(FakeEngineClient(), "/v1/completions", {"model": MODEL, "prompt": "hi", **body}))
    assert r.status_code in (400, 404), r.text
    assert error_of(r)["param"] == param


def test_unknown_model_is_404():
    r = run(post(FakeEngineClient(), "/v1/completions", {"model": "gpt-9", "prompt": "hi"}))
    assert r.status_code == 404 and error_of(r)["code"] == "model_not_found"


def test_prompt_longer_than_context_names_the_counts():
    r = run(post(FakeEngineClient(), "/v1/completions", {"model": MODEL, "prompt": "hello " * 60, "max_tokens": 10}))
    error = error_of(r)
    assert r.status_code == 400 and error["code"] == "context_length_exceeded"
    assert "64" in error["message"] and "60" in error["message"]


def test_empty_messages_and_malformed_json():
    r = run(post(FakeEngineClient(), "/v1/chat/completions", {"model": MODEL, "messages": []}))
    assert r.status_code == 400 and error_of(r)["param"] == "messages"

    async def raw() -> httpx.Response:
        async with client_for(FakeEngineClient()) as http:
            return await http.post(
                "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
            )

    r = run(raw())
    assert r.status_code == 400 and error_of(r)["code"] == "invalid_json"


def test_api_key():
    r = run(post(FakeEngineClient(), "/v1/completions", {"model": MODEL, "prompt": "hi"}, api_key="s3cret"))
    assert r.status_code == 401 and error_of(r)["type"] == "authentication_error"

    async def with_key() -> httpx.Response:
        async with client_for(FakeEngineClient(), api_key="s3cret") as http:
            return await http.post("/v1/completions", json={"model": MODEL, "prompt": "hi"},
                                   headers={"Authorization": "Bearer s3cret"})  # fmt: skip

    assert run(with_key()).status_code == 200


def test_queue_full_is_429_with_retry_after():
    r = run(post(FakeEngineClient(queue_full=True), "/v1/completions", {"model": MODEL, "prompt": "hi"}))
    assert r.status_code == 429 and r.headers["retry-after"] == "2"
    assert error_of(r)["type"] == "rate_limit_error"


def test_worker_failure_is_500_naming_the_request():
    r = run(post(FakeEngineClient(fail=True), "/v1/completions", {"model": MODEL, "prompt": "hi"}))
    assert r.status_code == 500
    assert "cmpl-" in error_of(r)["message"]
    body = {"model": MODEL, "prompt": "hi", "stream": True}
    payloads = sse_payloads(run(post(FakeEngineClient(fail=True), "/v1/completions", body)).text)
    assert "error" in payloads[0] and payloads[-1] == "[DONE]"


def test_unknown_route_is_openai_shaped_404():
    async def go() -> httpx.Response:
        async with client_for(FakeEngineClient()) as http:
            return await http.get("/v1/nothing")

    r = run(go())
    assert r.status_code == 404 and error_of(r)["code"] == "not_found"


def test_a_server_side_abort_is_503_with_retry_after_never_a_200():
    engine = FakeEngineClient(fail=True, error_code="unavailable")  # the worker stopped under the request
    r = run(post(engine, "/v1/completions", {"model": MODEL, "prompt": "hi"}))
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
    assert error_of(r)["code"] == "unavailable" and error_of(r)["type"] == "service_unavailable"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    payloads = sse_payloads(run(post(engine, "/v1/chat/completions", body)).text)
    assert payloads[-1] == "[DONE]" and payloads[-2]["error"]["code"] == "unavailable"
    assert set(payloads[-2]["error"]) == {"message", "type", "param", "code"}


def test_a_request_its_own_knobs_broke_is_a_400():
    engine = FakeEngineClient(fail=True, error_code="invalid_request")  # e.g. scores overflowed to inf
    r = run(post(engine, "/v1/completions", {"model": MODEL, "prompt": "hi"}))
    assert r.status_code == 400 and error_of(r)["code"] == "invalid_request"
    assert error_of(r)["type"] == "invalid_request_error"


def test_health_and_ready_are_503_once_the_worker_is_dead():
    engine = FakeEngineClient()
    engine.alive = False

    async def go() -> tuple[int, int]:
        async with client_for(engine) as http:
            return (await http.get("/health")).status_code, (await http.get("/ready")).status_code

    assert run(go()) == (503, 503)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("stream", [False, True])
def test_model_may_be_omitted_and_responses_name_the_served_model(path, stream):
    body = {"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    r = run(post(FakeEngineClient(), path, {**body, "max_tokens": 2, "stream": stream}))
    assert r.status_code == 200, r.text
    chunks = [p for p in sse_payloads(r.text) if p != "[DONE]"] if stream else [r.json()]
    assert chunks and all(c["model"] == MODEL for c in chunks)


@pytest.mark.parametrize("field", ["generation_preset", "custom_generate"])
def test_unknown_presets_and_custom_methods_are_a_clear_400(field):
    r = run(post(FakeEngineClient(), "/v1/completions", {"model": MODEL, "prompt": "hi", field: "x"}))
    assert r.status_code == 400 and error_of(r)["param"] == field


def test_chat_prompt_that_fills_the_context_names_messages():
    content = "hello " * 64  # 64 words + the template's token: no room left for one generated token
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    r = run(post(FakeEngineClient(), "/v1/chat/completions", body))
    assert r.status_code == 400 and error_of(r)["param"] == "messages"
    assert error_of(r)["code"] == "context_length_exceeded"
