"""While a replica drains, a request that reaches it is a 503 with ``Retry-After`` (a load balancer
retries it on another replica), never a 500: refused before any work when it arrives during the
drain, and still a 503 when it got in just before and reaches the tokenizer after the drain ended."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from decoding import EngineUnavailableError
from server.app import create_app
from server.config.settings import Settings
from tests.scripted_engine import ScriptedEngine, WordTokenizer, scripted_client
from tests.test_lifecycle_worker import assert_unavailable


class CountingTokenizer(WordTokenizer):
    """Counts its calls; ``started`` is set when an encode begins (it then takes ``delay``)."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(delay)
        self.calls = 0
        self.started = threading.Event()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.calls += 1
        self.started.set()
        return super().encode(text, add_special_tokens)


async def until(condition: object, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def test_a_request_arriving_while_the_server_drains_is_a_503_before_any_tokenizer_work():
    tokenizer = CountingTokenizer()
    client = scripted_client(ScriptedEngine(), tokenizer)
    app = create_app(Settings(), engine_client=client)

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            # in flight when the drain begins: it keeps the drain open, and finishes
            running = asyncio.create_task(http.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 300}))
            await until(lambda: client._in_flight)
            drain = asyncio.create_task(client.shutdown(drain_timeout=60))
            await until(client.is_draining)
            calls = tokenizer.calls
            chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}
            arriving = [
                ("/v1/completions", {"prompt": "hello world", "max_tokens": 5}),
                ("/v1/chat/completions", chat),
                ("/v1/chat/completions", {**chat, "stream": True}),
                ("/v1/watermark/detect", {"text": "hello world", "watermarking_config": {}}),
            ]
            for path, body in arriving:
                assert_unavailable(await http.post(path, json=body))
            assert tokenizer.calls == calls  # refused before the tokenizer or a template ran
            finished = await asyncio.wait_for(running, 30)
            assert finished.status_code == 200 and finished.json()["choices"][0]["finish_reason"] == "length"
            await asyncio.wait_for(drain, 30)

    asyncio.run(go())


def test_a_request_that_got_in_before_the_drain_ended_is_a_503_not_a_500():
    """It is tokenizing its first prompt when the drain ends (nothing was in the engine) and shuts the
    tokenizer thread down: its second prompt's tokenization, and then its submit, are refused."""
    tokenizer = CountingTokenizer(delay=0.3)
    client = scripted_client(ScriptedEngine(), tokenizer)
    app = create_app(Settings(), engine_client=client)

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            body = {"prompt": ["hello world", "hello"], "max_tokens": 5}
            request = asyncio.create_task(http.post("/v1/completions", json=body))
            await asyncio.to_thread(tokenizer.started.wait, 5)  # past the drain check, on the tokenizer
            await client.shutdown(drain_timeout=60)  # nothing in flight: over at once, the threads shut down
            return await asyncio.wait_for(request, 10)

    assert_unavailable(asyncio.run(go()))


@pytest.mark.parametrize("work", ["tokenize", "apply_chat_template", "decode"])
def test_text_work_after_the_drain_is_engine_unavailable(work):
    client = scripted_client(ScriptedEngine())
    calls = {
        "tokenize": lambda: client.tokenize("hello"),
        "apply_chat_template": lambda: client.apply_chat_template([{"role": "user", "content": "hello"}]),
        "decode": lambda: client.decode([1, 2]),
    }

    async def go() -> None:
        assert await calls[work]()  # before the drain: the text work runs
        await client.shutdown(drain_timeout=1)
        with pytest.raises(EngineUnavailableError):  # not RuntimeError (a 500), nor a template's 400
            await calls[work]()

    asyncio.run(go())
