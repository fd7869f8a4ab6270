"""``/v1/responses`` output: the response object and its output items, from the engine's collected output.

One response has one output: with a reasoning parser (``--reasoning-parser``), a ``reasoning`` item
first when the reply thought (its text one ``reasoning_text`` part, ``summary`` empty: the model
writes none), then a ``message`` item with one ``output_text`` part (its ``annotations``
always empty, its ``logprobs`` when ``include`` asked) when the answer has text (never an empty
one), then a ``function_call`` item per call the reply made (read by ``server.output.tool_parser``,
as chat's ``tool_calls``). ``usage.output_tokens_details.reasoning_tokens`` counts the output
tokens that fell in the thinking, as the stream counts them. A reply cut short is
``status: "incomplete"`` with ``incomplete_details.reason`` "max_output_tokens"; its unfinished call
is dropped. The streamed events (``server.api.responses.events``) build the same items.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from decoding import FinishReason, TokenLogprob
from server.api.responses.items import new_id
from server.output.collect import ChoiceState, Collected
from server.output.logprobs import chat_logprobs
from server.output.reasoning import ReasoningFormat, split_reply
from server.output.tool_parser import ParserFactory, ToolCall, parse_whole

LENGTH = FinishReason.LENGTH.value


def usage(input_tokens: int, cached_tokens: int, output_tokens: int, reasoning_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's Responses usage; ``cached_tokens`` are the prompt tokens the prefix cache supplied,
    ``reasoning_tokens`` the output tokens that fell in the thinking (``server.output.reasoning``)."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }


def output_logprobs(entries: list[TokenLogprob]) -> list[dict[str, Any]]:
    """``output_text.logprobs``: chat's per-token objects."""
    return chat_logprobs(entries)["content"]


def text_part(text: str, logprobs: list[TokenLogprob] | None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = output_logprobs(logprobs)
    return part


def message_item(item_id: str, parts: list[dict[str, Any]], status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": parts}


def reasoning_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """OpenAI's reasoning item with the thinking as its one ``reasoning_text`` part (None: no part yet)."""
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def function_call_item(call: ToolCall, status: str = "completed", arguments: str | None = None) -> dict[str, Any]:
    return {"id": f"fc_{call.id.removeprefix('call_')}", "type": "function_call", "call_id": call.id,
            "name": call.name, "arguments": call.arguments if arguments is None else arguments,
            "status": status}  # fmt: skip


@dataclass
class ResponseBuilder:
    """What every shape of one response shares: its id, model, creation time and the request's echo."""

    response_id: str
    model: str
    echo: dict[str, Any]  # ResponsesRequest.echo()
    logprobs: bool = False
    tool_parser: ParserFactory | None = None
    created_at: int = field(default_factory=lambda: int(time.time()))
    reasoning: ReasoningFormat | None = None  # the server's reasoning format (None: no split)

    def response(
        self, status: str, output: list[dict[str, Any]], usage_: dict[str, Any] | None = None, *,
        incomplete: bool = False, error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "model": self.model,
            "output": output,
            **self.echo,
            "usage": usage_,
        }

    def finished(self, output: list[dict[str, Any]], finish_reason: str | None, usage_: dict) -> dict[str, Any]:
        """The final object: completed, or incomplete when the reply ran out of tokens."""
        incomplete = finish_reason == LENGTH
        return self.response("incomplete" if incomplete else "completed", output, usage_, incomplete=incomplete)

    def body(self, collected: Collected) -> dict[str, Any]:
        """The non-streamed response."""
        state = collected.choices.get(0) or ChoiceState(0, finish_reason=LENGTH)
        truncated = state.finish_reason == LENGTH
        split = split_reply(state.text, self.reasoning, state.pieces)
        thinking, text = split.thinking, split.answer
        calls: list[ToolCall] = []
        if self.tool_parser is not None:
            content, calls = parse_whole(text, self.tool_parser, truncated=truncated)
            text = content or ""
        output = []
        if thinking is not None:  # cut short while thinking: incomplete, as the stream closes it
            status = "incomplete" if truncated and not text and not calls else "completed"
            output.append(reasoning_item(new_id("rs"), thinking, status))
        if text:  # no message without text (a reply that only thought, or only called, has none)
            part = text_part(text, state.logprobs if self.logprobs else None)
            output.append(message_item(new_id("msg"), [part], "incomplete" if truncated else "completed"))
        output.extend(function_call_item(call) for call in calls)
        counts = usage(collected.num_prompt_tokens, collected.num_cached_tokens, len(state.token_ids),
                       split.reasoning_tokens)  # fmt: skip
        return self.finished(output, state.finish_reason, counts)
