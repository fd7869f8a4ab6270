"""``/v1/chat/completions`` output: per choice a role chunk, content chunks, tool-call chunks, a finish chunk.

A streamed choice is a ``ChoiceStream``, which owns everything one choice carries from delta to
delta: whether its role chunk went out, its reasoning split (``--reasoning-parser``: the thinking goes
out as ``delta.reasoning_content`` and ``delta.reasoning``, vLLM's two names, before the answer's
chunks) and its tool-call parser, which reads only the answer (both may hold text back), the
logprobs of tokens whose text is held back (they go out with the next chunk of that choice, so a
stream carries every entry the body does), the calls sent so far and the finish. ``ChatFormat``
only wraps each choice's pieces in chunk envelopes.
"""

from __future__ import annotations

from decoding import FinishReason, RequestOutput, SequenceDelta, TokenLogprob
from server.output.collect import ChoiceState, Collected
from server.output.envelope import Envelope
from server.output.logprobs import chat_logprobs
from server.output.reasoning import ReasoningFormat, split_reply
from server.output.tool_parser import ParserFactory, ToolCall, parse_whole

LENGTH = FinishReason.LENGTH.value


def finish_reason_of(reason: str | None, num_calls: int, legacy: bool = False) -> str | None:
    """OpenAI's: ``tool_calls`` (``function_call`` for a legacy ``functions`` request) when the reply
    made calls, unless it was cut short (``length`` tells the client the reply is incomplete; an
    unfinished call is dropped, never reported)."""
    if not num_calls or reason == LENGTH:
        return reason
    return "function_call" if legacy else "tool_calls"


class ChoiceStream:
    """One chat choice as it streams; ``pieces`` turns one engine delta into the choice objects to send."""

    def __init__(
        self, index: int, tool_parser: ParserFactory | None, return_token_ids: bool, legacy: bool = False,
        reasoning: ReasoningFormat | None = None,
    ) -> None:  # fmt: skip
        """``legacy``: the request used OpenAI's ``functions``: its one call is ``function_call``."""
        self.legacy = legacy
        self.index = index
        self.parser = tool_parser() if tool_parser is not None else None
        self.reasoning = reasoning.stream() if reasoning is not None else None
        self.return_token_ids = return_token_ids
        self.started = False
        self.num_calls = 0
        self.held_logprobs: list[TokenLogprob] | None = None  # entries whose text the parser still holds

    def pieces(self, delta: SequenceDelta) -> list[dict]:
        pieces = [] if self.started else [self._piece({"role": "assistant", "content": ""})]
        self.started = True
        if delta.logprobs is not None:
            self.held_logprobs = (self.held_logprobs or []) + list(delta.logprobs)
        thinking, text, calls = self._parse(delta)
        if thinking:
            reasoning: dict = {"reasoning_content": thinking, "reasoning": thinking}
            if self.return_token_ids and not text:  # the delta's ids go with its last text
                reasoning["token_ids"] = delta.token_ids
            pieces.append(self._piece(reasoning))
        holds_text = self.parser is not None or self.reasoning is not None
        if text or (delta.token_ids and not thinking and (not holds_text or self.return_token_ids)):
            content: dict = {"content": text}
            if self.return_token_ids:
                content["token_ids"] = delta.token_ids
            pieces.append(self._piece(content))
        pieces.extend(self._call_pieces(calls))
        if delta.finish_reason is not None:
            reason = finish_reason_of(delta.finish_reason.value, self.num_calls, self.legacy)
            final = self._piece({}, finish_reason=reason)
            if delta.sequence_score is not None:
                final["sequence_score"] = delta.sequence_score
            pieces.append(final)
        return pieces

    def _parse(self, delta: SequenceDelta) -> tuple[str, str, list[ToolCall]]:
        """The thinking and the answer's text to release, and the calls completed by this delta (all of
        it answer text without parsers); the tool-call parser reads only the answer."""
        thinking, text = "", delta.text
        if self.reasoning is not None:
            thinking, text = self.reasoning.feed(delta.text, len(delta.token_ids))
            if delta.finish_reason is not None:
                more_thinking, rest = self.reasoning.finish()
                thinking, text = thinking + more_thinking, text + rest
        if self.parser is None:
            return thinking, text, []
        text, calls = self.parser.feed(text)
        if delta.finish_reason is not None:
            rest, more = self.parser.finish(truncated=delta.finish_reason == FinishReason.LENGTH)
            text, calls = text + rest, calls + more
        return thinking, text, calls

    @property
    def reasoning_tokens(self) -> int:
        return self.reasoning.reasoning_tokens if self.reasoning is not None else 0

    def _call_pieces(self, calls: list[ToolCall]) -> list[dict]:
        """OpenAI's streamed tool call: its id, type and name with empty arguments, then the arguments."""
        pieces = []
        for call in calls:
            k = self.num_calls
            self.num_calls += 1
            head = {"index": k, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
            for part in (head, {"index": k, "function": {"arguments": call.arguments}}):
                pieces.append(self._piece(_legacy_piece(part) if self.legacy else {"tool_calls": [part]}))
        return pieces

    def _piece(self, delta: dict, finish_reason: str | None = None) -> dict:
        """A choice object carrying the held logprobs (an empty list only with content, as before)."""
        logprobs, self.held_logprobs = self.held_logprobs, None
        if finish_reason is not None and not logprobs:
            logprobs = None
        return {"index": self.index, "delta": delta,
                "logprobs": chat_logprobs(logprobs) if logprobs is not None else None,
                "finish_reason": finish_reason}  # fmt: skip


def _legacy_piece(part: dict) -> dict:
    """A streamed call piece in the legacy shape: ``{"function_call": {"name", "arguments"}}``."""
    return {"function_call": dict(part["function"])}


class ChatFormat(Envelope):
    """``/v1/chat/completions``: chunks of each choice's stream, or the whole message per choice."""

    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(
        self, request_id: str, model: str, n: int, *, logprobs: bool = False,
        tool_parser: ParserFactory | None = None, legacy_functions: bool = False,
        reasoning: ReasoningFormat | None = None, **options: bool,
    ) -> None:  # fmt: skip
        """``tool_parser``: makes a ``server.output.tool_parser`` stream when the request offered tools;
        ``legacy_functions``: it offered them as OpenAI's old ``functions`` (replies in that shape);
        ``reasoning``: the server's reasoning format (``server.output.reasoning``; None: no split)."""
        super().__init__(request_id, model, n, **options)
        self.logprobs = logprobs
        self.tool_parser = tool_parser
        self.legacy = legacy_functions
        self.reasoning = reasoning
        self._choices: dict[int, ChoiceStream] = {}

    def chunks(self, prompt_index: int, output: RequestOutput) -> list[dict]:
        self._count(prompt_index, output)
        chunks = []
        for delta in output.deltas:
            stream = self._choices.get(delta.index)
            if stream is None:
                stream = self._choices[delta.index] = ChoiceStream(delta.index, self.tool_parser, self.return_token_ids,
                                                                   self.legacy, self.reasoning)  # fmt: skip
            chunks.extend(self._chunk([piece]) for piece in stream.pieces(delta))
        return chunks

    def _streamed_reasoning_tokens(self) -> int:
        return sum(stream.reasoning_tokens for stream in self._choices.values())

    def body(self, results: list[Collected]) -> dict:
        (collected,) = results
        choices, reasoning_tokens = [], 0
        for index in range(self.n):
            state = collected.choices.get(index) or ChoiceState(index, finish_reason="length")
            split = split_reply(state.text, self.reasoning, state.pieces)
            thinking, answer = split.thinking, split.answer
            reasoning_tokens += split.reasoning_tokens
            message: dict = {"role": "assistant", "content": answer, "refusal": None}
            if self.reasoning is not None:  # vLLM's two names for the same text; null when the reply did not think
                message["reasoning_content"] = message["reasoning"] = thinking
                message["content"] = answer or None
            finish_reason = state.finish_reason
            if self.tool_parser is not None:
                content, calls = parse_whole(answer, self.tool_parser, truncated=finish_reason == LENGTH)
                message["content"] = content
                if calls and self.legacy:  # one call at most: the legacy API had no parallel calls
                    message["function_call"] = {"name": calls[0].name, "arguments": calls[0].arguments}
                elif calls:
                    message["tool_calls"] = [call.as_json() for call in calls]
                finish_reason = finish_reason_of(finish_reason, len(calls), self.legacy)
            choice = {
                "index": index,
                "message": message,
                "logprobs": chat_logprobs(state.logprobs) if self.logprobs and index in collected.choices else None,
                "finish_reason": finish_reason,
            }
            choices.append(self._extend(choice, state.token_ids, state.sequence_score))
        return self._body(choices, results, reasoning_tokens)
