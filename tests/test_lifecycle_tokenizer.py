"""Tokenization and chat templates run off the event loop, on one thread of the client's own:
a slow tokenization never stalls /health or other requests."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx

from server.app import create_app
from server.config.settings import Settings
from tests.scripted_engine import WordTokenizer, scripted_client


class RecordingTokenizer(WordTokenizer):
    """Slow, and notes the thread of every call (a fast tokenizer must not be shared across threads)."""

    def __init__(self, delay: float) -> None:
        super().__init__(delay)
        self.threads: set[threading.Thread] = set()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.threads.add(threading.current_thread())
        return super().encode(text, add_special_tokens)

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        self.threads.add(threading.current_thread())
        return super().decode(token_ids, skip_special_tokens)


def test_a_slow_tokenization_does_not_stall_health_or_other_requests():
    tokenizer = RecordingTokenizer(delay=0.0)
    client = scripted_client(tokenizer=tokenizer)
    app = create_app(Settings(), engine_client=client)

    async def go() -> tuple[float, float, list[int]]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            tokenizer.delay = 1.0
            slow = asyncio.create_task(
                http.post("/v1/completions", json={"prompt": "hello " * 5000, "max_tokens": 2, "echo": True})
            )
            started = time.monotonic()
            await asyncio.sleep(0.1)  # the slow prompt is being tokenized now (on the loop, this took 1 s)
            health = await http.get("/health")
            health_seconds = time.monotonic() - started
            tokens = await http.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
            other_seconds = time.monotonic() - started
            statuses = [health.status_code, tokens.status_code, (await slow).status_code]
            return health_seconds, other_seconds, statuses

    try:
        health_seconds, other_seconds, statuses = asyncio.run(go())
    finally:
        client.worker.stop(5)
    assert statuses == [200, 200, 200]
    assert health_seconds < 0.4, health_seconds  # not the 1 s of the tokenization
    assert other_seconds < 0.6, other_seconds  # a request with token ids needs no tokenizer
    (thread,) = tokenizer.threads  # encode and decode (echo): always the same thread, never the loop's
    assert thread is not threading.main_thread() and thread.name.startswith("decoda-tokenizer")
