"""When the worker stops or dies, every request it knows of ends in a 503 at once (never a hang, never
a 200 without a finish reason), and /health and /ready say so."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from decoding.outputs import RequestOutput
from decoding.params import GenerationParams
from server.app import create_app
from server.config.settings import Settings
from tests.scripted_engine import ScriptedEngine, scripted_client, wait_for

LONG = {"prompt": "hello world", "max_tokens": 50_000, "temperature": 0}


def sse_payloads(text: str) -> list:
    events = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "unavailable" and error["type"] == "service_unavailable"
    assert int(response.headers["retry-after"]) >= 1


def assert_stream_ends_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 200  # the stream had started: the error is an event
    payloads = sse_payloads(response.text)
    assert payloads[-1] == "[DONE]"
    error = payloads[-2]["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "unavailable"
    assert not any(p != "[DONE]" and "choices" in p and p["choices"][0]["finish_reason"] for p in payloads[:-2])


async def in_flight(http: httpx.AsyncClient, engine: ScriptedEngine) -> tuple[asyncio.Task, asyncio.Task]:
    """A non-streaming completion and a streaming chat, both running in the engine."""
    plain = asyncio.create_task(http.post("/v1/completions", json=LONG))
    chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 50_000, "stream": True}
    streaming = asyncio.create_task(http.post("/v1/chat/completions", json=chat))
    deadline = time.monotonic() + 5
    while len(engine.requests) < 2:
        assert time.monotonic() < deadline, "requests never reached the engine"
        await asyncio.sleep(0.01)
    return plain, streaming


def test_stopping_the_worker_fails_in_flight_requests_with_503():
    engine = ScriptedEngine()
    client = scripted_client(engine)
    app = create_app(Settings(), engine_client=client)

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            plain, streaming = await in_flight(http, engine)
            await asyncio.to_thread(client.worker.stop, 5)  # what shutdown does once the drain deadline passed
            assert_unavailable(await asyncio.wait_for(plain, 5))
            assert_stream_ends_unavailable(await asyncio.wait_for(streaming, 5))
            assert_unavailable(await http.post("/v1/completions", json=LONG))  # no new admissions either
            assert (await http.get("/ready")).status_code == 503

    asyncio.run(go())
    assert engine.fail_all_codes == ["unavailable"]


def test_a_crashed_worker_fails_everything_at_once_and_health_goes_red():
    engine = ScriptedEngine()
    client = scripted_client(engine)
    app = create_app(Settings(), engine_client=client)

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            assert (await http.get("/health")).status_code == 200
            plain, streaming = await in_flight(http, engine)
            started = time.monotonic()
            engine.crash = True  # has_work raises on the worker thread: the loop dies
            assert_unavailable(await asyncio.wait_for(plain, 5))
            assert_stream_ends_unavailable(await asyncio.wait_for(streaming, 5))
            assert time.monotonic() - started < 2  # at once, not after a timeout
            assert (await http.get("/health")).status_code == 503
            assert (await http.get("/ready")).status_code == 503
            assert_unavailable(await http.post("/v1/completions", json=LONG))

    asyncio.run(go())


def test_commands_left_in_the_inbox_and_late_submits_are_answered():
    engine = ScriptedEngine()
    engine.gate = __import__("threading").Event()
    client = scripted_client(engine)
    worker = client.worker
    outputs: dict[str, list[RequestOutput]] = {}

    def sink(output: RequestOutput) -> None:
        outputs.setdefault(output.request_id, []).append(output)

    params = GenerationParams(max_new_tokens=1000)
    worker.submit("running", [1, 2], params, sink)
    wait_for(engine.stepping.is_set)  # the worker is inside a step
    worker.stop(timeout=0)  # asks the loop to end after this step
    worker.submit("queued", [1], params, sink)  # still a command in the inbox when the loop ends
    engine.gate.set()
    worker._thread.join(5)
    assert not worker.alive
    worker.submit("late", [1], params, sink)  # races with the end: answered on the caller's thread
    for request_id in ("running", "queued", "late"):
        last = outputs[request_id][-1]
        assert last.finished and last.error and last.error_code == "unavailable", (request_id, last)
