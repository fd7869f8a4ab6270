"""Engine streams to the client: SSE chunks then ``[DONE]``, or one collected body; disconnect → abort.

Several engine requests (one per prompt) are merged into one sequence of outputs. Whoever stops
reading the merge (sse-starlette cancelling the generator when the client goes away, an error in
one of the prompts, a non-streaming client that hung up) closes every engine stream, which aborts
its request in the worker, so its rows are freed at the next step.

A failed output ends the response: ``error_code`` "unavailable" (the server stopped) is a 503,
anything else a 500; a stream carries the same OpenAI error object as an SSE event, then
``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing
from typing import Protocol, TypeVar

from fastapi import Request
from sse_starlette.sse import AppStatus

from decoding import RequestOutput
from server.http.errors import from_exception, from_output
from server.output.collect import Collected

DONE = "[DONE]"
T = TypeVar("T")


class ChunkFormat(Protocol):
    """What the output path needs from an API's formatter (``server.api.<name>.format``, over
    ``server.output.envelope.Envelope``): stream events per engine output, a usage event, the body."""

    request_id: str
    include_usage: bool

    def chunks(self, prompt_index: int, output: RequestOutput) -> list[dict]: ...

    def usage_chunk(self) -> dict: ...

    def body(self, results: list[Collected]) -> dict: ...


def drain_streams_on_shutdown() -> None:
    """Let in-flight streams finish on SIGTERM instead of sse-starlette cutting them at once.

    uvicorn already waits for open connections (up to ``drain_timeout``) before the lifespan
    shutdown; ``close_remaining_streams`` then ends whatever is left.
    """
    AppStatus.disable_automatic_graceful_drain()


def close_remaining_streams() -> None:
    AppStatus.should_exit = True


async def merge(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave outputs of several engine requests as they arrive, tagged with the stream index.

    Each stream is read by its own pump task. Closing the merge cancels the pumps and waits for
    them to unwind out of their streams (the cancellation aborts each request) before closing
    the streams a pump never started; closing a stream another task is still inside would raise
    "aclose(): asynchronous generator is already running".
    """
    if len(streams) == 1:
        try:
            async for output in streams[0]:
                yield 0, output
        finally:
            await streams[0].aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()
    end = object()
    started = [False] * len(streams)

    async def pump(index: int, stream: AsyncIterator[RequestOutput]) -> None:
        started[index] = True
        try:
            async for output in stream:
                queue.put_nowait((index, output))
        except Exception as exc:  # surfaced to the consumer below
            queue.put_nowait((index, exc))
        finally:
            queue.put_nowait((index, end))
            await stream.aclose()

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item = await queue.get()
            if item is end:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        for stream, began in zip(streams, started, strict=True):
            if not began:  # its pump was cancelled before it ran: nobody else will close it
                await stream.aclose()
        await asyncio.gather(*tasks, return_exceptions=True)


async def collect_all(streams: list[AsyncIterator[RequestOutput]]) -> list[Collected]:
    """Every stream's outputs accumulated, for a non-streaming body; a failed output raises its API error."""
    results = [Collected() for _ in streams]
    async with aclosing(merge(streams)) as merged:
        async for index, output in merged:
            if output.error:
                raise from_output(output)
            results[index].add(output)
    return results


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` but cancel it (aborting its engine requests) if the client goes away."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise asyncio.CancelledError("client disconnected")
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def event(payload: dict) -> dict:
    return {"data": json.dumps(payload, ensure_ascii=False)}


async def sse_events(streams: list[AsyncIterator[RequestOutput]], fmt: ChunkFormat) -> AsyncIterator[dict]:
    """Run the merged streams through ``fmt`` (one output → OpenAI chunks), then ``[DONE]``."""
    try:
        async with aclosing(merge(streams)) as merged:
            failed = False
            async for index, output in merged:
                if output.error:
                    yield event(from_output(output).body())
                    failed = True
                    break
                for chunk in fmt.chunks(index, output):
                    yield event(chunk)
        if fmt.include_usage and not failed:
            yield event(fmt.usage_chunk())
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        yield event(from_exception(exc, fmt.request_id).body())
    yield {"data": DONE}
