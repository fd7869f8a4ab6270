"""``/v1/responses`` with ``stream: true``: OpenAI's semantic events, in its order, each with its
``sequence_number`` and named on the SSE ``event:`` line as on its ``type``.

``response.created``, ``response.in_progress``; with a reasoning parser, the thinking first as a
``reasoning`` item: ``response.output_item.added``, ``response.content_part.added`` (a
``reasoning_text`` part), ``response.reasoning_text.delta``..., ``response.reasoning_text.done``,
``response.content_part.done``, ``response.output_item.done`` (closed when the answer starts); a
message as ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta``..., ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``; each function call as
``response.output_item.added``, ``response.function_call_arguments.delta``,
``response.function_call_arguments.done``, ``response.output_item.done``; then
``response.completed`` (or ``response.incomplete``, or ``response.failed`` with the error). The
tool-call parser holds back text that may start a call (as chat's stream does), and the logprobs of
held text go out with the next delta, so the deltas carry every entry the final object does.

A background response starts with ``response.created`` and ``response.queued`` (status queued),
then ``response.in_progress`` once its runner starts; a cancelled one ends with
``response.cancelled``. A response that ends early (failed, cancelled) closes its open message as
``incomplete``, so its final object holds every text its deltas sent. ``ResponseEvents`` records how
its text went out (``deltas``: each delta's characters and logprob entries), which is what
``server.api.responses.replay`` needs to rebuild the same events from the final object.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

from decoding import FinishReason, RequestOutput, SequenceDelta
from server.api.responses.format import (
    LENGTH,
    ResponseBuilder,
    function_call_item,
    message_item,
    output_logprobs,
    reasoning_item,
    text_part,
    usage,
)
from server.api.responses.items import new_id
from server.http.errors import from_exception, from_output
from server.output.streaming import merge
from server.output.tool_parser import ToolCall


class ResponseEvents:
    """One streamed response: the events each engine output adds, and the items they build."""

    def __init__(self, builder: ResponseBuilder) -> None:
        self.builder = builder
        self.parser = builder.tool_parser() if builder.tool_parser is not None else None
        self.reasoning = builder.reasoning.stream() if builder.reasoning is not None else None
        self.thought: dict[str, Any] | None = None  # the open reasoning item
        self.thinking = ""
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # finished items
        self.message: dict[str, Any] | None = None  # the open message item
        self.text = ""
        self.spaces = ""  # whitespace held back while no message is open: it may only separate calls
        self.logprobs: list[dict[str, Any]] = []  # the open message's entries (as output), sent so far
        self.held: list[dict[str, Any]] = []  # entries (as output) whose text the parser still holds
        self.deltas: dict[int, list[list[int]]] = {}  # output index -> [characters, entries] of each text delta
        self.finish_reason: str | None = None
        self.counts = (0, 0, 0)  # input, cached, output tokens

    def _event(self, kind: str, **fields: Any) -> dict[str, str]:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return {"event": kind, "data": json.dumps(payload, ensure_ascii=False)}

    def start(self) -> list[dict[str, str]]:
        snapshot = self.builder.response("in_progress", [])
        return [self._event("response.created", response=snapshot),
                self._event("response.in_progress", response=snapshot)]  # fmt: skip

    def queued(self) -> list[dict[str, str]]:
        """A background response's first events: created, and waiting for its runner."""
        snapshot = self.builder.response("queued", [])
        return [self._event("response.created", response=snapshot),
                self._event("response.queued", response=snapshot)]  # fmt: skip

    def in_progress(self) -> list[dict[str, str]]:
        return [self._event("response.in_progress", response=self.builder.response("in_progress", []))]

    def feed(self, output: RequestOutput) -> list[dict[str, str]]:
        generated = self.counts[2] + sum(len(delta.token_ids) for delta in output.deltas)
        self.counts = (output.num_prompt_tokens, output.num_cached_tokens, generated)
        events: list[dict[str, str]] = []
        for delta in output.deltas:
            if delta.index == 0:
                events.extend(self._delta(delta))
        return events

    def _delta(self, delta: SequenceDelta) -> list[dict[str, str]]:
        self.held.extend(output_logprobs(delta.logprobs or []))  # a thinking delta's go out with the message's
        thinking, text, calls = "", delta.text, []
        if self.reasoning is not None:  # the thinking split off first: the tool parser reads only the answer
            thinking, text = self.reasoning.feed(delta.text, len(delta.token_ids))
            if delta.finish_reason is not None:
                more, rest = self.reasoning.finish()
                thinking, text = thinking + more, text + rest
        events = self._thinking(thinking) if thinking else []
        if self.parser is not None:
            text, calls = self.parser.feed(text)
            if delta.finish_reason is not None:
                rest, more = self.parser.finish(truncated=delta.finish_reason == FinishReason.LENGTH)
                text, calls = text + rest, calls + more
        if self.parser is not None and self.message is None and not text.strip():
            self.spaces += text  # whitespace before a call is the call format's, not a message (as the body's)
        else:
            text, self.spaces = self.spaces + text, ""
            events.extend(self._text(text) if text else [])
        for call in calls:
            self.spaces = ""
            events.extend(self._close_reasoning())
            events.extend(self._close_message())
            events.extend(self._call(call))
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason.value
            if self.spaces and not any(item["type"] == "function_call" for item in self.output):
                events.extend(self._text(self.spaces))  # a reply of whitespace alone: its message, as the body's
            self.spaces = ""
        return events

    def _thinking(self, text: str, item_id: str | None = None) -> list[dict[str, str]]:
        """A reasoning delta, opening the reasoning item first if it is not open (an open message is
        closed first: each item has its own output index; the reasoning split never thinks after the
        answer started, so this is a guard, not a path)."""
        events = [] if self.thought is not None else self._close_message()
        index = len(self.output)
        if self.thought is None:
            self.thought = reasoning_item(item_id or new_id("rs"), None, "in_progress")
            self.thinking = ""
            events += [self._event("response.output_item.added", output_index=index, item=self.thought),
                       self._event("response.content_part.added", item_id=self.thought["id"], output_index=index,
                                   content_index=0, part={"type": "reasoning_text", "text": ""})]  # fmt: skip
        self.thinking += text
        self.deltas.setdefault(index, []).append([len(text), 0])
        events.append(self._event("response.reasoning_text.delta", item_id=self.thought["id"], output_index=index,
                                  content_index=0, delta=text))  # fmt: skip
        return events

    def _close_reasoning(self, status: str | None = None) -> list[dict[str, str]]:
        if self.thought is None:
            return []
        index, item_id = len(self.output), self.thought["id"]
        status = status or ("incomplete" if self.finish_reason == LENGTH else "completed")
        item = reasoning_item(item_id, self.thinking, status)
        self.output.append(item)
        self.thought = None
        return [self._event("response.reasoning_text.done", item_id=item_id, output_index=index, content_index=0,
                            text=self.thinking),
                self._event("response.content_part.done", item_id=item_id, output_index=index, content_index=0,
                            part=item["content"][0]),
                self._event("response.output_item.done", output_index=index, item=item)]  # fmt: skip

    def _open_message(self, item_id: str | None = None) -> list[dict[str, str]]:
        if self.message is not None:
            return []
        events = self._close_reasoning()  # the answer begins: the thinking is over
        self.message = message_item(item_id or new_id("msg"), [], "in_progress")
        self.text, self.logprobs = "", []
        index = len(self.output)
        return events + [
            self._event("response.output_item.added", output_index=index, item=self.message),
            self._event("response.content_part.added", item_id=self.message["id"], output_index=index,
                        content_index=0, part=text_part("", [] if self.builder.logprobs else None)),
        ]  # fmt: skip

    def _text(self, text: str) -> list[dict[str, str]]:
        events = self._open_message()
        sent, self.held = self.held, []
        self.text += text
        self.logprobs.extend(sent)
        self.deltas.setdefault(len(self.output), []).append([len(text), len(sent)])
        assert self.message is not None
        events.append(self._event("response.output_text.delta", item_id=self.message["id"],
                                  output_index=len(self.output), content_index=0, delta=text,
                                  logprobs=sent if self.builder.logprobs else []))  # fmt: skip
        return events

    def _close_message(self, status: str | None = None) -> list[dict[str, str]]:
        if self.message is None:
            return []
        self.logprobs.extend(self.held)
        self.held = []
        index, item_id = len(self.output), self.message["id"]
        part = text_part(self.text, None)
        if self.builder.logprobs:
            part["logprobs"] = self.logprobs
        status = status or ("incomplete" if self.finish_reason == LENGTH else "completed")
        item = message_item(item_id, [part], status)
        self.output.append(item)
        self.message = None
        return [self._event("response.output_text.done", item_id=item_id, output_index=index, content_index=0,
                            text=self.text, logprobs=part.get("logprobs", [])),
                self._event("response.content_part.done", item_id=item_id, output_index=index, content_index=0,
                            part=part),
                self._event("response.output_item.done", output_index=index, item=item)]  # fmt: skip

    def _call(self, call: ToolCall) -> list[dict[str, str]]:
        index = len(self.output)
        item = function_call_item(call)
        self.output.append(item)
        return [self._event("response.output_item.added", output_index=index,
                            item=function_call_item(call, "in_progress", arguments="")),
                self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                            delta=call.arguments),
                self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                            name=call.name, arguments=call.arguments),
                self._event("response.output_item.done", output_index=index, item=item)]  # fmt: skip

    def usage(self) -> dict[str, Any]:
        reasoning_tokens = self.reasoning.reasoning_tokens if self.reasoning is not None else 0
        return usage(*self.counts, reasoning_tokens)

    def finish(self) -> tuple[list[dict[str, str]], dict[str, Any]]:
        """The closing events of the open item and the final object (a reply with no answer text has no
        message item, as the body); its own event (``final_event``) goes out once the response is stored."""
        events = self._close_reasoning() + self._close_message()
        return events, self.builder.finished(self.output, self.finish_reason, self.usage())

    def replay_message(self, item: dict[str, Any], deltas: list[list[int]] | None) -> list[dict[str, str]]:
        """A finished message item's events again, its text cut as ``deltas`` recorded it went out (one
        delta when unknown), through the same event code as the live stream."""
        part = item["content"][0]
        text, entries = part["text"], list(part.get("logprobs", []))
        if deltas is None:
            deltas = [[len(text), len(entries)]] if text else []
        events = self._open_message(item["id"])
        start = used = 0
        for chars, count in deltas:
            self.held = entries[used : used + count]
            events.extend(self._text(text[start : start + chars]))
            start, used = start + chars, used + count
        self.held = entries[used:]
        return events + self._close_message(item["status"])

    def replay_reasoning(self, item: dict[str, Any], deltas: list[list[int]] | None) -> list[dict[str, str]]:
        """A finished reasoning item's events again, its text cut as ``deltas`` recorded it went out."""
        text = "".join(part["text"] for part in item.get("content") or [])
        if deltas is None:
            deltas = [[len(text), 0]] if text else []
        events, start = [], 0
        for chars, _ in deltas:
            events.extend(self._thinking(text[start : start + chars], item["id"]))
            start += chars
        return events + self._close_reasoning(item.get("status") or "completed")

    def replay_call(self, item: dict[str, Any]) -> list[dict[str, str]]:
        """A function_call item's events again (its item id derives from its ``call_id``, as live)."""
        return self._call(ToolCall(item["name"], item["arguments"], item["call_id"]))

    def interrupted(self, status: str, error: dict[str, Any] | None = None) -> tuple[list[dict[str, str]], dict]:
        """The events closing the open message (as incomplete) and the final object of a response that
        ended early: ``failed`` with ``error``, or ``cancelled``; its output is what was produced."""
        events = self._close_reasoning("incomplete") + self._close_message("incomplete")
        return events, self.builder.response(status, self.output, self.usage(), error=error)

    def final_event(self, response: dict[str, Any]) -> dict[str, str]:
        return self._event(f"response.{response['status']}", response=response)

    def error_event(self, code: str, message: str, param: str | None = None) -> dict[str, str]:
        """OpenAI's ``error`` event: something went wrong beside the response (its store), not in it."""
        return self._event("error", code=code, message=message, param=param)


def failure(exc: Exception, response_id: str) -> dict[str, Any]:
    """A failed response's ``error``: the API error the exception is, as code and message."""
    error = from_exception(exc, response_id)
    return {"code": error.code or "server_error", "message": error.message}


async def response_events(
    streams: list[AsyncIterator[RequestOutput]], events: ResponseEvents,
    keep: Callable[[dict[str, Any]], Awaitable[dict[str, Any] | None]],
) -> AsyncIterator[dict[str, str]]:  # fmt: skip
    """The engine's stream as events; ``keep`` stores the final object before its event goes out,
    so a client that reads ``response.completed`` can retrieve or continue the response at once. A
    store that fails (``keep`` returns the failure) is an ``error`` event just before the final one."""
    for event in events.start():
        yield event
    try:
        async with aclosing(merge(streams)) as merged:
            async for _, output in merged:
                if output.error:
                    raise from_output(output)
                for event in events.feed(output):
                    yield event
        closing, response = events.finish()
        for event in closing:
            yield event
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        closing, response = events.interrupted("failed", failure(exc, events.builder.response_id))
        for event in closing:
            yield event
    failed = await keep(response)
    if failed is not None:
        yield events.error_event(**failed)
    yield events.final_event(response)
