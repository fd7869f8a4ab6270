"""Drive an ASGI app by hand, so a test can hang up mid-stream exactly when it wants to.

httpx's ASGI transport reads a whole response before returning it; a client that disconnects
after the first SSE chunk needs ``receive`` to answer ``http.disconnect`` at that moment.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable


async def stream_then_hang_up(app: Callable, path: str, body: dict | bytes, after_chunks: int = 1,
                              headers: list[tuple[bytes, bytes]] | None = None) -> list[bytes]:  # fmt: skip
    """POST ``body`` (JSON, or bytes sent as they are with ``headers``: a multipart form) to ``path`` and
    disconnect once ``after_chunks`` body chunks arrived; returns them."""
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    chunks: list[bytes] = []
    hung_up = asyncio.Event()
    request_sent = False

    async def receive() -> dict:
        nonlocal request_sent
        if not request_sent:
            request_sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await hung_up.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body" and message.get("body") and not hung_up.is_set():
            chunks.append(message["body"])
            if len(chunks) >= after_chunks:
                hung_up.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers or [(b"content-type", b"application/json"), (b"host", b"test")],
        "client": ("127.0.0.1", 50000),
        "server": ("test", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), 30)
    return chunks
