"""``/v1/messages`` with ``stream: true``: Anthropic's events, each named on its SSE ``event:`` line.

``message_start`` (the message with empty content and the prompt's usage, once the engine's first
output says how much of the prompt the prefix cache supplied), ``ping``, then per content block
``content_block_start``, its ``content_block_delta`` events (``text_delta``, or one
``input_json_delta`` holding a call's whole ``partial_json``: a call is sent once its parser has read
all of it) and ``content_block_stop``; then ``message_delta`` (``stop_reason``, ``stop_sequence`` and
the usage so far, cumulative as Anthropic's) and ``message_stop``. A request that fails sends an
``error`` event in Anthropic's error shape instead of the rest (the SDK raises it); there is no
``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from decoding import RequestOutput
from server.api.messages.errors import anthropic_error
from server.api.messages.format import Reply
from server.http.errors import from_exception, from_output
from server.output.streaming import merge


def sse(payload: dict[str, Any]) -> dict[str, str]:
    """One event, named as its ``type``."""
    return {"event": payload["type"], "data": json.dumps(payload, ensure_ascii=False)}


async def message_events(streams: list[AsyncIterator[RequestOutput]], reply: Reply) -> AsyncIterator[dict[str, str]]:
    started = False
    try:
        async with aclosing(merge(streams)) as merged:
            async for _, output in merged:
                if output.error:
                    raise from_output(output)
                events = reply.feed(output)
                if not started:
                    started = True
                    yield sse({"type": "message_start", "message": reply.message(content=[], finished=False)})
                    yield sse({"type": "ping"})
                for event in events:
                    yield sse(event)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        yield sse(anthropic_error(from_exception(exc, reply.message_id)))
        return
    if not started:  # the engine ended the request without an output: the message, empty
        yield sse({"type": "message_start", "message": reply.message(content=[], finished=False)})
    stop_reason, stop_sequence = reply.stop()
    yield sse({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
               "usage": reply.usage()})  # fmt: skip
    yield sse({"type": "message_stop"})
