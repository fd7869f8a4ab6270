"""Engine outputs → OpenAI JSON: chunks and bodies of both endpoints, logprobs in each one's format, usage.

One formatter per response (``CompletionFormat``, ``ChatFormat``) turns each engine output into
SSE chunks as it arrives and the collected outputs into the final body, counting usage on the
way. The choice index of a completion with several prompts is ``prompt_index * n + index``, as
OpenAI numbers them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from decoding import RequestOutput, TokenLogprob
from server.tool_parser import parse_whole


@dataclass
class ChoiceState:
    """One choice as it accumulates over a request's outputs."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    sequence_score: float | None = None  # beam search, when logprobs were asked for


@dataclass
class Collected:
    """Everything one engine request produced, for the non-streaming response."""

    choices: dict[int, ChoiceState] = field(default_factory=dict)
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_generated_tokens: int = 0
    prompt_logprobs: list[TokenLogprob] | None = None
    drafts: tuple[int, int] = (0, 0)  # speculative decoding: (proposed, accepted), cumulative

    def add(self, output: RequestOutput) -> None:
        self.num_prompt_tokens = output.num_prompt_tokens
        self.num_cached_tokens = output.num_cached_tokens
        self.num_generated_tokens = output.num_generated_tokens
        self.drafts = (output.num_draft_tokens, output.num_accepted_draft_tokens)
        if output.prompt_logprobs is not None:
            self.prompt_logprobs = output.prompt_logprobs
        for delta in output.deltas:
            choice = self.choices.setdefault(delta.index, ChoiceState(delta.index))
            choice.text += delta.text
            choice.token_ids.extend(delta.token_ids)
            choice.logprobs.extend(delta.logprobs or [])
            if delta.finish_reason is not None:
                choice.finish_reason = delta.finish_reason.value
            if delta.sequence_score is not None:
                choice.sequence_score = delta.sequence_score


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int, drafts: tuple[int, int] = (0, 0), cached: int = 0) -> dict:
    """OpenAI's usage object. A request that speculated also reports its drafts in OpenAI's own
    Predicted Outputs fields, ``completion_tokens_details.accepted_prediction_tokens`` and
    ``rejected_prediction_tokens`` (a client reads its acceptance rate from them; the openai
    client parses them). Unlike OpenAI's, rejected drafts are not counted in ``completion_tokens``.
    Prompt tokens served from the prefix cache are ``prompt_tokens_details.cached_tokens``, as OpenAI's."""
    body: dict = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached:
        body["prompt_tokens_details"] = {"cached_tokens": cached}
    num_drafted, num_accepted = drafts
    if num_drafted:
        body["completion_tokens_details"] = {
            "accepted_prediction_tokens": num_accepted,
            "rejected_prediction_tokens": num_drafted - num_accepted,
        }
    return body


def _sum_drafts(drafts: list[tuple[int, int]]) -> tuple[int, int]:
    return sum(d[0] for d in drafts), sum(d[1] for d in drafts)


def completion_logprobs(entries: list[TokenLogprob], text_offset: int) -> dict:
    """Legacy completions format: parallel lists plus character offsets into the choice text."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = text_offset
    for entry in entries:
        tokens.append(entry.token)
        token_logprobs.append(entry.logprob)
        top.append({alt.token: alt.logprob for alt in entry.top} if entry.logprob is not None else None)
        offsets.append(offset)
        offset += len(entry.token)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8"))


def chat_logprobs(entries: list[TokenLogprob]) -> dict:
    return {
        "content": [
            {
                "token": e.token,
                "logprob": e.logprob,
                "bytes": _bytes(e.token),
                "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": _bytes(t.token)} for t in e.top],
            }
            for e in entries
        ]
    }


class _Format:
    """What both endpoints share: ids, the chunk envelope, usage counting, per-choice extensions."""

    object_name = ""
    chunk_object = ""

    def __init__(
        self, request_id: str, model: str, n: int, *, return_token_ids: bool = False, include_usage: bool = False
    ) -> None:
        self.request_id, self.model, self.n = request_id, model, n
        self.return_token_ids = return_token_ids
        self.include_usage = include_usage
        self.created = now()
        self._prompt_tokens: dict[int, int] = {}  # per prompt index, as the stream reports them
        self._cached_tokens: dict[int, int] = {}  # ... and those the prefix cache supplied
        self._completion_tokens = 0
        self._drafts: dict[int, tuple[int, int]] = {}  # per prompt index: (proposed, accepted) so far

    def _count(self, prompt_index: int, output: RequestOutput) -> None:
        self._prompt_tokens[prompt_index] = output.num_prompt_tokens
        self._cached_tokens[prompt_index] = output.num_cached_tokens
        self._completion_tokens += sum(len(delta.token_ids) for delta in output.deltas)
        self._drafts[prompt_index] = (output.num_draft_tokens, output.num_accepted_draft_tokens)

    def _chunk(self, choices: list[dict]) -> dict:
        return {"id": self.request_id, "object": self.chunk_object, "created": self.created, "model": self.model,
                "choices": choices, "usage": None}  # fmt: skip

    def usage_chunk(self) -> dict:
        drafts = _sum_drafts(list(self._drafts.values()))
        prompt, cached = sum(self._prompt_tokens.values()), sum(self._cached_tokens.values())
        return {**self._chunk([]), "usage": usage(prompt, self._completion_tokens, drafts, cached)}

    def _body(self, choices: list[dict], results: list[Collected]) -> dict:
        prompt_tokens = sum(r.num_prompt_tokens for r in results)
        completion_tokens = sum(len(c.token_ids) for r in results for c in r.choices.values())
        drafts = _sum_drafts([r.drafts for r in results])
        cached = sum(r.num_cached_tokens for r in results)
        return {"id": self.request_id, "object": self.object_name, "created": self.created, "model": self.model,
                "choices": choices, "usage": usage(prompt_tokens, completion_tokens, drafts, cached)}  # fmt: skip

    def _extend(self, choice: dict, token_ids: list[int], sequence_score: float | None) -> dict:
        """Serving extensions: ``return_token_ids``, and beam search's ``sequence_score``."""
        if self.return_token_ids:
            choice["token_ids"] = token_ids
        if sequence_score is not None:
            choice["sequence_score"] = sequence_score
        return choice


class CompletionFormat(_Format):
    """``/v1/completions``: ``text`` choices, the legacy logprobs format, ``echo``."""

    object_name = chunk_object = "text_completion"

    def __init__(self, request_id: str, model: str, n: int, *, echo_texts: list[str] | None = None,
                 logprobs: bool = False, **options: bool) -> None:  # fmt: skip
        super().__init__(request_id, model, n, **options)
        self.echo_texts = echo_texts  # each prompt's text, prepended to its choices when echo is on
        self.logprobs = logprobs
        self._echoed: set[tuple[int, int]] = set()

    def chunks(self, prompt_index: int, output: RequestOutput) -> list[dict]:
        self._count(prompt_index, output)
        chunks = []
        for delta in output.deltas:
            text = delta.text
            if self.echo_texts is not None and (prompt_index, delta.index) not in self._echoed:
                self._echoed.add((prompt_index, delta.index))
                text = self.echo_texts[prompt_index] + text
            choice = {
                "index": prompt_index * self.n + delta.index,
                "text": text,
                "logprobs": completion_logprobs(delta.logprobs, 0) if delta.logprobs is not None else None,
                "finish_reason": delta.finish_reason.value if delta.finish_reason else None,
            }
            chunks.append(self._chunk([self._extend(choice, delta.token_ids, delta.sequence_score)]))
        return chunks

    def body(self, results: list[Collected]) -> dict:
        choices = []
        for prompt_index, collected in enumerate(results):
            for index in range(self.n):
                state = collected.choices.get(index) or ChoiceState(index, finish_reason="length")
                entries = state.logprobs
                text = state.text
                if self.echo_texts is not None:
                    entries = (collected.prompt_logprobs or []) + entries
                    text = self.echo_texts[prompt_index] + text
                choice = {
                    "index": prompt_index * self.n + index,
                    "text": text,
                    "logprobs": completion_logprobs(entries, 0) if self.logprobs else None,
                    "finish_reason": state.finish_reason,
                }
                choices.append(self._extend(choice, state.token_ids, state.sequence_score))
        return self._body(choices, results)


class ChatFormat(_Format):
    """``/v1/chat/completions``: a role chunk, content chunks, a finish chunk per choice."""

    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(
        self, request_id: str, model: str, n: int, *, logprobs: bool = False, tool_parser: type | None = None,
        **options: bool,
    ) -> None:  # fmt: skip
        """``tool_parser``: a ``server.tool_parser`` stream class when the request offered tools."""
        super().__init__(request_id, model, n, **options)
        self.logprobs = logprobs
        self.tool_parser = tool_parser
        self._started: set[int] = set()
        self._tool_streams: dict[int, object] = {}  # choice index -> its parser stream
        self._num_calls: dict[int, int] = {}  # choice index -> tool calls sent

    def chunks(self, prompt_index: int, output: RequestOutput) -> list[dict]:
        self._count(prompt_index, output)
        chunks = []
        for delta in output.deltas:
            if delta.index not in self._started:
                self._started.add(delta.index)
                first = {"index": delta.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                         "finish_reason": None}  # fmt: skip
                chunks.append(self._chunk([first]))
            text, calls = delta.text, []
            if self.tool_parser is not None:
                stream = self._tool_streams.setdefault(delta.index, self.tool_parser())
                text, calls = stream.feed(delta.text)
                if delta.finish_reason is not None:
                    rest, more = stream.finish()
                    text, calls = text + rest, calls + more
            if text or (delta.token_ids and (self.tool_parser is None or self.return_token_ids)):
                content: dict = {"content": text}
                if self.return_token_ids:
                    content["token_ids"] = delta.token_ids
                choice = {
                    "index": delta.index,
                    "delta": content,
                    "logprobs": chat_logprobs(delta.logprobs) if delta.logprobs is not None else None,
                    "finish_reason": None,
                }
                chunks.append(self._chunk([choice]))
            chunks.extend(self._call_chunks(delta.index, calls))
            if delta.finish_reason is not None:
                reason = "tool_calls" if self._num_calls.get(delta.index) else delta.finish_reason.value
                final = {"index": delta.index, "delta": {}, "logprobs": None, "finish_reason": reason}
                if delta.sequence_score is not None:
                    final["sequence_score"] = delta.sequence_score
                chunks.append(self._chunk([final]))
        return chunks

    def _call_chunks(self, index: int, calls: list) -> list[dict]:
        """OpenAI's streamed tool call: its id, type and name with empty arguments, then the arguments."""
        chunks = []
        for call in calls:
            k = self._num_calls.get(index, 0)
            self._num_calls[index] = k + 1
            head = {"index": k, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
            for piece in (head, {"index": k, "function": {"arguments": call.arguments}}):
                chunks.append(self._chunk([{"index": index, "delta": {"tool_calls": [piece]}, "logprobs": None,
                                            "finish_reason": None}]))  # fmt: skip
        return chunks

    def body(self, results: list[Collected]) -> dict:
        (collected,) = results
        choices = []
        for index in range(self.n):
            state = collected.choices.get(index) or ChoiceState(index, finish_reason="length")
            message: dict = {"role": "assistant", "content": state.text}
            finish_reason = state.finish_reason
            if self.tool_parser is not None:
                content, calls = parse_whole(state.text, self.tool_parser)
                if calls:
                    message = {"role": "assistant", "content": content,
                               "tool_calls": [call.as_json() for call in calls]}  # fmt: skip
                    finish_reason = "tool_calls"
            choice = {
                "index": index,
                "message": message,
                "logprobs": chat_logprobs(state.logprobs) if self.logprobs and index in collected.choices else None,
                "finish_reason": finish_reason,
            }
            choices.append(self._extend(choice, state.token_ids, state.sequence_score))
        return self._body(choices, results)
