"""Body size (413), concurrency per API key (429), request ids and access logs, through the real app."""

from __future__ import annotations

import asyncio
import json
import logging
import re

import httpx
import pytest

from server.http.access_log import JsonFormatter
from tests.fake_engine import FakeEngineClient
from tests.test_api import MODEL, client_for, error_of, run
from tests.test_auth import settings_from

BODY = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
HEX_ID = re.compile(r"[0-9a-f]{32}")


def test_a_body_over_the_limit_is_a_413_from_its_length():
    big = {**BODY, "prompt": "x" * 5000}
    r = run(_post(big, max_request_bytes=4096))
    assert r.status_code == 413
    error = error_of(r)
    assert error["code"] == "request_too_large" and "4096 bytes" in error["message"]
    assert run(_post(BODY, max_request_bytes=4096)).status_code == 200


def test_a_chunked_body_over_the_limit_is_a_413_as_it_arrives():
    payload = json.dumps({**BODY, "prompt": "x" * 5000}).encode()

    async def chunks():  # no Content-Length: the server counts what arrives
        for i in range(0, len(payload), 1000):
            yield payload[i : i + 1000]

    async def go() -> httpx.Response:
        async with client_for(FakeEngineClient(), max_request_bytes=4096) as http:
            return await http.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})

    r = run(go())
    assert r.status_code == 413 and error_of(r)["code"] == "request_too_large"


def test_concurrency_per_key_answers_429_with_retry_after_and_frees_when_a_request_ends(tmp_path):
    settings = settings_from(["--api-key", "k1", "--api-key", "k2", "--max-concurrency-per-key", "2"],
                             tmp_path=tmp_path)  # fmt: skip

    async def go() -> tuple[list[httpx.Response], httpx.Response, httpx.Response]:
        async with client_for(FakeEngineClient(delay=0.2), **vars(settings)) as http:
            def call(key: str):  # noqa: ANN202
                return http.post("/v1/completions", json={**BODY, "max_tokens": 3},
                                 headers={"Authorization": f"Bearer {key}"})  # fmt: skip

            first = [asyncio.ensure_future(call("k1")) for _ in range(2)]
            await asyncio.sleep(0.1)  # both of k1's slots are taken
            third, other_key = await asyncio.gather(call("k1"), call("k2"))
            done = await asyncio.gather(*first)
            again = await call("k1")
            return [*done, third], other_key, again

    k1, k2, again = run(go())
    assert [r.status_code for r in k1] == [200, 200, 429]
    assert k1[2].headers["retry-after"] == "1" and error_of(k1[2])["code"] == "concurrency_limit"
    assert "--max-concurrency-per-key" in error_of(k1[2])["message"]
    assert k2.status_code == 200  # another key has its own slots
    assert again.status_code == 200  # a slot came back when k1's requests ended


def test_request_id_is_kept_when_given_and_generated_otherwise(caplog):
    async def go() -> list[httpx.Response]:
        async with client_for(FakeEngineClient(), max_request_bytes=64) as http:
            return [
                await http.post("/v1/completions", json=BODY, headers={"X-Request-Id": "lb-7f3a.9"}),
                await http.post("/v1/completions", json=BODY, headers={"X-Request-Id": "not an id\t"}),
                await http.get("/health"),
                await http.post("/v1/completions", json={**BODY, "prompt": "y" * 100}),  # a 413 carries one too
            ]

    with caplog.at_level(logging.INFO, logger="decoda.access"):
        kept, replaced, health, refused = run(go())
    assert kept.headers["x-request-id"] == "lb-7f3a.9"
    assert HEX_ID.fullmatch(replaced.headers["x-request-id"])
    assert HEX_ID.fullmatch(health.headers["x-request-id"])
    assert refused.status_code == 413 and HEX_ID.fullmatch(refused.headers["x-request-id"])
    lines = [r for r in caplog.records if r.name == "decoda.access"]
    assert [(r.request_id, r.path, r.status) for r in lines] == [
        ("lb-7f3a.9", "/v1/completions", 200),
        (replaced.headers["x-request-id"], "/v1/completions", 200),
        (health.headers["x-request-id"], "/health", 200),
        (refused.headers["x-request-id"], "/v1/completions", 413),
    ]
    assert all(r.duration_ms >= 0 and r.method in ("GET", "POST") for r in lines)
    assert "request_id=lb-7f3a.9" in lines[0].getMessage()


def test_a_stream_is_logged_when_it_ends_with_its_whole_size(caplog):
    async def go() -> httpx.Response:
        async with client_for(FakeEngineClient(delay=0.05)) as http:
            return await http.post("/v1/completions", json={**BODY, "max_tokens": 4, "stream": True})

    with caplog.at_level(logging.INFO, logger="decoda.access"):
        r = run(go())
    (line,) = [rec for rec in caplog.records if rec.name == "decoda.access"]
    assert line.status == 200 and line.response_bytes == len(r.content) and "[DONE]" in r.text
    assert line.duration_ms >= 4 * 50 * 0.9  # the whole stream, not the time to its first byte


def test_json_log_lines_carry_the_access_fields():
    record = logging.LogRecord("decoda.access", logging.INFO, __file__, 1, "%s done", ("x",), None)
    for name, value in {"request_id": "abc", "method": "POST", "path": "/v1/completions", "status": 200,
                        "duration_ms": 12.5, "response_bytes": 99, "client": "127.0.0.1:5"}.items():  # fmt: skip
        setattr(record, name, value)
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "x done" and entry["level"] == "info" and entry["logger"] == "decoda.access"
    assert entry["request_id"] == "abc" and entry["status"] == 200 and entry["duration_ms"] == 12.5
    plain = json.loads(JsonFormatter().format(logging.LogRecord("uvicorn.error", 30, __file__, 1, "hi", (), None)))
    assert plain["level"] == "warning" and "request_id" not in plain


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--log-format", "xml"], "log_format must be one of text, json"),
        (["--max-request-bytes", "-1"], "max_request_bytes must be >= 0"),
        (["--max-concurrency-per-key", "-2"], "max_concurrency_per_key must be >= 0"),
    ],
)
def test_bad_limit_settings_fail_at_startup(argv, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        settings_from(argv, tmp_path=tmp_path)


async def _post(body: dict, **settings: object) -> httpx.Response:
    async with client_for(FakeEngineClient(), **settings) as http:
        return await http.post("/v1/completions", json=body)


def test_a_control_character_in_the_url_cannot_forge_a_log_line(caplog):
    async def go() -> httpx.Response:
        async with client_for(FakeEngineClient()) as http:
            return await http.get("/v1/models%0a127.0.0.1:1%20%22GET%20/admin%22%20200%0d%1b[2J")

    with caplog.at_level(logging.INFO, logger="decoda.access"):
        run(go())
    (line,) = [r for r in caplog.records if r.name == "decoda.access"]
    assert line.path == '/v1/models\\x0a127.0.0.1:1 "GET /admin" 200\\x0d\\x1b[2J'
    text = line.getMessage()
    assert "\n" not in text and "\r" not in text and "\x1b" not in text
    entry = json.loads(JsonFormatter().format(line))
    assert entry["path"] == line.path and "\n" not in entry["message"]


def counting_engine() -> FakeEngineClient:
    """A fake engine with a 64-token context that counts its tokenizer and template runs."""
    from decoding import ModelFacts

    class Counting(FakeEngineClient):
        calls = 0

        async def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
            self.calls += 1
            return await super().tokenize(text, add_special_tokens)

        async def apply_chat_template(self, messages, tools=None):  # noqa: ANN001, ANN201
            self.calls += 1
            return await super().apply_chat_template(messages, tools)

    engine = Counting()
    engine.facts = ModelFacts(vocab_size=100, max_model_len=64, num_layers=4, max_chars_per_token=4)
    return engine


def test_a_text_too_long_for_any_tokenization_is_refused_before_the_tokenizer_runs():
    engine = counting_engine()
    long_text = "hello " * 50  # 300 characters: more than 64 tokens of at most 4 characters can spell

    async def go() -> list[httpx.Response]:
        async with client_for(engine) as http:
            return [
                await http.post("/v1/completions", json={**BODY, "prompt": long_text}),
                await http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": long_text}]}),
                await http.post("/v1/completions", json=BODY),
            ]

    completion, chat, fine = run(go())
    for answer, param in ((completion, "prompt"), (chat, "messages")):
        assert answer.status_code == 400
        assert error_of(answer)["param"] == param and error_of(answer)["code"] == "context_length_exceeded"
    assert fine.status_code == 200 and engine.calls == 1  # only the request that fits was tokenized


def test_every_rendered_text_is_size_checked_before_any_template_or_tokenizer():
    """Tool-call arguments, a message's name and a negative prompt are rendered or tokenized too: each
    counts against the context before the template runs; a bad knob is refused before the template."""
    engine = counting_engine()
    long_text = "hello " * 50
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": "' + long_text + '"}'}}
    ask = [{"role": "user", "content": "hi"}]

    async def go() -> list[httpx.Response]:
        async with client_for(engine) as http:
            return [
                await http.post("/v1/chat/completions", json={"messages": [
                    *ask, {"role": "assistant", "content": None, "tool_calls": [call]}]}),
                await http.post("/v1/chat/completions", json={"messages": [
                    {"role": "user", "content": "hi", "name": long_text}]}),
                await http.post("/v1/completions", json={**BODY, "negative_prompt": long_text,
                                                          "guidance_scale": 1.5}),
                await http.post("/v1/chat/completions", json={"messages": ask, "top_p": 7}),
            ]  # fmt: skip

    *too_long, bad_knob = run(go())
    for answer, param in zip(too_long, ("messages", "messages", "negative_prompt"), strict=True):
        assert answer.status_code == 400, answer.text
        assert error_of(answer)["param"] == param and error_of(answer)["code"] == "context_length_exceeded"
    assert bad_knob.status_code == 400 and error_of(bad_knob)["param"] == "top_p"
    assert engine.calls == 0  # no template, no tokenizer ran for any of them


def test_the_served_tokenizers_longest_token_bounds_the_text(smollm2_tokenizer):
    from decoding.engine.launch import max_chars_per_token

    longest = max_chars_per_token(smollm2_tokenizer)
    assert 4 <= longest <= 256  # SmolLM2: 81, a run of spaces after a newline
    for token_id in range(0, smollm2_tokenizer.vocab_size, 97):  # no token spells more text than that
        assert len(smollm2_tokenizer.decode([token_id])) <= longest


def test_without_api_keys_an_invented_token_does_not_escape_the_limit(tmp_path):
    """Without keys, a caller is its client address: fresh bearer tokens share its slots."""
    settings = settings_from(["--max-concurrency-per-key", "1"], tmp_path=tmp_path)

    async def go() -> list[httpx.Response]:
        async with client_for(FakeEngineClient(delay=0.2), **vars(settings)) as http:
            def call(token: str):  # noqa: ANN202
                return http.post("/v1/completions", json={**BODY, "max_tokens": 3},
                                 headers={"Authorization": f"Bearer {token}"})  # fmt: skip

            first = asyncio.ensure_future(call("made-up-1"))
            await asyncio.sleep(0.1)
            second = await call("made-up-2")
            return [await first, second]

    first, second = run(go())
    assert first.status_code == 200 and second.status_code == 429
