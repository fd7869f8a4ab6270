"""OpenAI's server-sent events: chunks as they come, a usage chunk when asked, then ``[DONE]``.

Several engine requests (one per prompt) are merged into one event stream. When the client goes
away, sse-starlette cancels the generator; closing the engine iterators aborts the requests in
the worker, so their rows are freed at the next step.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

from sse_starlette.sse import AppStatus

from decoding import RequestOutput
from server.errors import from_exception

DONE = "[DONE]"


def drain_streams_on_shutdown() -> None:
    """Let in-flight streams finish on SIGTERM instead of sse-starlette cutting them at once.

    uvicorn already waits for open connections (up to ``drain_timeout``) before the lifespan
    shutdown; ``close_remaining_streams`` then ends whatever is left.
    """
    AppStatus.disable_automatic_graceful_drain()


def close_remaining_streams() -> None:
    AppStatus.should_exit = True


async def merge(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave outputs of several engine requests as they arrive, tagged with the stream index."""
    if len(streams) == 1:
        async for output in streams[0]:
            yield 0, output
        return
    queue: asyncio.Queue = asyncio.Queue()
    sentinel = object()

    async def pump(index: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for output in stream:
                await queue.put((index, output))
        except Exception as exc:  # surfaced to the consumer below
            await queue.put((index, exc))
        finally:
            await queue.put((index, sentinel))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item = await queue.get()
            if item is sentinel:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        for stream in streams:
            await stream.aclose()


def event(payload: dict) -> dict:
    return {"data": json.dumps(payload, ensure_ascii=False)}


async def sse_events(
    streams: list[AsyncIterator[RequestOutput]],
    chunks_for: Callable[[int, RequestOutput], list[dict]],
    usage_chunk: Callable[[], dict] | None,
    request_id: str,
) -> AsyncIterator[dict]:
    """Run the merged streams through ``chunks_for`` (one output → OpenAI chunks)."""
    try:
        async for index, output in merge(streams):
            if output.error:
                yield event(_stream_error(output.error))
                yield {"data": DONE}
                return
            for chunk in chunks_for(index, output):
                yield event(chunk)
        if usage_chunk is not None:
            yield event(usage_chunk())
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        yield event(from_exception(exc, request_id).body())
    yield {"data": DONE}


def _stream_error(message: str) -> dict:
    return {"error": {"message": message, "type": "server_error", "param": None, "code": "internal"}}
