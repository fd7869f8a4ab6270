"""A Messages API reply: its content blocks as the text arrives, its stop reason, usage and message object.

``ContentBlocks`` is the one place blocks are made, for a stream (the block events it returns) and
for a whole body (its ``blocks`` once fed everything) alike, so both give the same content: text
blocks, and a ``tool_use`` block (``id``, ``name``, ``input``) for each call the configured tool-call
parser (``server.output.tool_parser``) reads, which the text around it never shows. Whitespace
between calls belongs to the call format, not to a text block. With a reasoning parser
(``--reasoning-parser``), the thinking comes first as a ``thinking`` block (streamed as
``thinking_delta``; its ``signature`` empty: nothing here signs it), split off before the tool-call
parser reads the answer (``server.output.reasoning``); with ``thinking.display: "omitted"`` the block
comes with its text left out (empty, and no ``thinking_delta``), as Anthropic's. Every block
started is stopped before the next starts, and indexes only grow: the thinking block is closed when
the answer begins, the text block when a call or the end comes.

``stop_reason``: ``max_tokens`` when the length limit cut the reply (its unfinished call dropped),
``tool_use`` when it made calls, ``stop_sequence`` (with ``stop_sequence``) when a stop string ended
it, else ``end_turn``. ``usage`` is Anthropic's: ``input_tokens`` counts the prompt tokens computed
for this request, ``cache_read_input_tokens`` those the prefix cache supplied (their sum is the
prompt, what ``count_tokens`` says), ``output_tokens`` the reply's.
"""

from __future__ import annotations

import uuid
from typing import Any

from decoding import FinishReason, RequestOutput, SequenceDelta
from server.output.exact_json import loads
from server.output.reasoning import ReasoningFormat, ReasoningStream, thinking_block
from server.output.tool_parser import ParserFactory, ToolCall, ToolStream

LENGTH = FinishReason.LENGTH.value


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": prompt_tokens - cached_tokens, "output_tokens": output_tokens,
            "cache_read_input_tokens": cached_tokens, "cache_creation_input_tokens": 0}  # fmt: skip


def stop_reason_of(finish_reason: str | None, stopped_by: str | int | None, num_calls: int) -> tuple[str, str | None]:
    """(``stop_reason``, ``stop_sequence``), see the module's docstring."""
    if finish_reason == LENGTH:
        return "max_tokens", None
    if num_calls:
        return "tool_use", None
    if isinstance(stopped_by, str):
        return "stop_sequence", stopped_by
    return "end_turn", None


def tool_use_block(call: ToolCall) -> dict[str, Any]:
    """The call as a block; its ``input`` read exactly (``server.output.exact_json``: a ``1e999`` stays
    as written, never ``inf``, which no strict JSON encoder writes)."""
    return {"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"), "name": call.name,
            "input": loads(call.arguments)}  # fmt: skip


class ContentBlocks:
    """The reply's content blocks as its text arrives; ``feed`` returns the block events it made."""

    def __init__(
        self, parser: ToolStream | None, reasoning: ReasoningStream | None = None, show_thinking: bool = True
    ) -> None:
        self.parser = parser
        self.reasoning = reasoning
        self.show_thinking = show_thinking  # false: thinking.display "omitted"
        self.open_thinking: dict[str, Any] | None = None  # the thinking block still growing
        self.blocks: list[dict[str, Any]] = []
        self.open_text: dict[str, Any] | None = None  # the text block still growing
        self.spaces = ""  # whitespace held back: it may only separate calls
        self.num_calls = 0

    def feed(self, text: str, finish_reason: FinishReason | None = None, num_tokens: int = 0) -> list[dict[str, Any]]:
        calls: list[ToolCall] = []
        thinking = ""
        if self.reasoning is not None:  # the thinking first: the tool-call parser reads only the answer
            thinking, text = self.reasoning.feed(text, num_tokens)
            if finish_reason is not None:
                more, rest = self.reasoning.finish()
                thinking, text = thinking + more, text + rest
        events = self._thinking(thinking) if thinking else []
        if self.parser is not None:
            text, calls = self.parser.feed(text)
            if finish_reason is not None:
                rest, more = self.parser.finish(truncated=finish_reason == FinishReason.LENGTH)
                text, calls = text + rest, calls + more
        events += self._text(text)
        for call in calls:
            events += self._close_text() + self._close_thinking() + self._tool_use(call)
        if finish_reason is not None:
            events += self._close_text() + self._close_thinking()
        return events

    def _thinking(self, text: str) -> list[dict[str, Any]]:
        """A thinking delta, opening the thinking block first (an open text block is stopped first: the
        reasoning split never thinks after the answer started, so that is a guard, not a path)."""
        events = []
        if self.open_thinking is None:
            events += self._close_text()
            self.open_thinking = thinking_block("")
            self.blocks.append(self.open_thinking)
            events.append(self._event("content_block_start", content_block=thinking_block("")))
        if not self.show_thinking:
            return events
        self.open_thinking["thinking"] += text
        return events + [self._event("content_block_delta", delta={"type": "thinking_delta", "thinking": text})]

    def _close_thinking(self) -> list[dict[str, Any]]:
        if self.open_thinking is None:
            return []
        self.open_thinking = None
        return [self._event("content_block_stop")]

    def _text(self, text: str) -> list[dict[str, Any]]:
        if self.parser is not None and self.open_text is None and not text.strip():
            self.spaces += text
            return []
        text, self.spaces = self.spaces + text, ""
        if not text:
            return []
        events = self._close_thinking()  # the answer begins: the thinking is over
        if self.open_text is None:
            self.open_text = {"type": "text", "text": ""}
            self.blocks.append(self.open_text)
            events.append(self._event("content_block_start", content_block={"type": "text", "text": ""}))
        self.open_text["text"] += text
        return events + [self._event("content_block_delta", delta={"type": "text_delta", "text": text})]

    def _close_text(self) -> list[dict[str, Any]]:
        self.spaces = ""
        if self.open_text is None:
            return []
        self.open_text = None
        return [self._event("content_block_stop")]

    def _tool_use(self, call: ToolCall) -> list[dict[str, Any]]:
        block = tool_use_block(call)
        self.blocks.append(block)
        self.num_calls += 1
        return [self._event("content_block_start", content_block={**block, "input": {}}),
                self._event("content_block_delta", delta={"type": "input_json_delta", "partial_json": call.arguments}),
                self._event("content_block_stop")]  # fmt: skip

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        """A block event of the newest block."""
        return {"type": kind, "index": len(self.blocks) - 1, **fields}


class Reply:
    """One message as the engine's outputs arrive: its blocks, counts, and how it ended."""

    def __init__(
        self, message_id: str, model: str, tool_parser: ParserFactory | None, reasoning: ReasoningFormat | None = None,
        show_thinking: bool = True,
    ) -> None:  # fmt: skip
        self.message_id, self.model = message_id, model
        self.content = ContentBlocks(tool_parser() if tool_parser is not None else None,
                                     reasoning.stream() if reasoning is not None else None, show_thinking)  # fmt: skip
        self.counts = (0, 0, 0)  # prompt, cached, output tokens
        self.finish_reason: str | None = None
        self.stopped_by: str | int | None = None

    def feed(self, output: RequestOutput) -> list[dict[str, Any]]:
        """The block events one engine output adds (one reply: choice 0)."""
        generated = self.counts[2] + sum(len(delta.token_ids) for delta in output.deltas)
        self.counts = (output.num_prompt_tokens, output.num_cached_tokens, generated)
        events: list[dict[str, Any]] = []
        for delta in output.deltas:
            if delta.index == 0:
                events += self._delta(delta)
        return events

    def _delta(self, delta: SequenceDelta) -> list[dict[str, Any]]:
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason.value
            self.stopped_by = delta.stop_reason
        return self.content.feed(delta.text, delta.finish_reason, len(delta.token_ids))

    def stop(self) -> tuple[str, str | None]:
        return stop_reason_of(self.finish_reason, self.stopped_by, self.content.num_calls)

    def usage(self) -> dict[str, int]:
        return usage(*self.counts)

    def message(self, content: list[dict[str, Any]] | None = None, finished: bool = True) -> dict[str, Any]:
        """The message object: finished (its blocks, stop reason, usage), or as a stream starts it."""
        stop_reason, stop_sequence = self.stop() if finished else (None, None)
        return {"id": self.message_id, "type": "message", "role": "assistant", "model": self.model,
                "content": self.content.blocks if content is None else content, "stop_reason": stop_reason,
                "stop_sequence": stop_sequence, "usage": self.usage()}  # fmt: skip
