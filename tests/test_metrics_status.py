"""``decoda_http_requests_total{route,status}``: every response is counted, errors included, and the
counting middleware leaves SSE streams unbuffered."""

from __future__ import annotations

import asyncio
import json
import time

from prometheus_client.parser import text_string_to_metric_families

from server.app import create_app
from server.config.settings import Settings
from tests.fake_engine import FakeEngineClient
from tests.test_api import MODEL, client_for, run


def http_counts(exposition: str) -> dict[tuple[str, str], float]:
    return {
        (s.labels["route"], s.labels["status"]): s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
        if s.name == "decoda_http_requests_total"
    }


def test_responses_are_counted_by_route_template_and_status():
    async def go() -> str:
        async with client_for(FakeEngineClient()) as http:
            ok = await http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1})
            bad = await http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "num_beam": 2})
            chat = {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}
            unknown = await http.post("/v1/chat/completions", json=chat)
            missing = await http.get("/no/such/path")
            assert [r.status_code for r in (ok, bad, unknown, missing)] == [200, 400, 404, 404]
            await http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1})
            return (await http.get("/metrics")).text

    counts = http_counts(run(go()))
    assert counts[("/v1/completions", "200")] == 2
    assert counts[("/v1/completions", "400")] == 1
    assert counts[("/v1/chat/completions", "404")] == 1
    assert counts[("unmatched", "404")] == 1  # never the raw path, so the label set stays bounded
    assert not [route for route, _ in counts if route == "/no/such/path"]


def test_401s_are_counted_when_keys_are_set():
    async def go() -> str:
        async with client_for(FakeEngineClient(), api_key="s3cret", protect_metrics=True) as http:
            assert (await http.get("/v1/models")).status_code == 401
            assert (await http.get("/metrics")).status_code == 401
            auth = {"Authorization": "Bearer s3cret"}
            assert (await http.get("/v1/models", headers=auth)).status_code == 200
            return (await http.get("/metrics", headers=auth)).text

    counts = http_counts(run(go()))
    assert counts[("/v1/models", "401")] == 1
    assert counts[("/v1/models", "200")] == 1
    assert counts[("/metrics", "401")] == 1  # refused before routing, still named by its route


def test_streaming_is_not_buffered_by_the_counting_middleware():
    """Drive the ASGI app directly: each SSE event leaves as its own body message, as it is made."""
    steps, delay = 4, 0.05
    app = create_app(Settings(), engine_client=FakeEngineClient(delay=delay))
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": steps, "stream": True}).encode()
    messages: list[tuple[float, dict]] = []

    async def go() -> None:
        finished = asyncio.Event()
        sent_body = False

        async def receive() -> dict:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await finished.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            messages.append((time.monotonic(), message))

        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
            "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions", "root_path": "",
            "query_string": b"", "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
            "client": ("127.0.0.1", 1234), "server": ("test", 80),
        }  # fmt: skip
        try:
            await asyncio.wait_for(app(scope, receive, send), timeout=30)
        finally:
            finished.set()

    run(go())
    start = messages[0][1]
    assert start["type"] == "http.response.start" and start["status"] == 200
    chunks = [(t, m) for t, m in messages if m["type"] == "http.response.body" and m.get("body")]
    data = [(t, m) for t, m in chunks if b"data:" in m["body"]]
    assert len(data) >= steps + 1  # one event per token, then [DONE]
    assert b"[DONE]" in data[-1][1]["body"] and b"[DONE]" not in data[0][1]["body"]
    # the first token left long before the last one was generated
    assert data[-1][0] - data[0][0] >= (steps - 1) * delay * 0.8
    counts = http_counts(app.state.metrics.render().decode())
    assert counts[("/v1/completions", "200")] == 1
