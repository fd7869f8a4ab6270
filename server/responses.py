"""Engine outputs → OpenAI JSON: accumulated choices, logprobs in each endpoint's format, usage."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from decoding import RequestOutput, TokenLogprob


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
    num_generated_tokens: int = 0
    prompt_logprobs: list[TokenLogprob] | None = None

    def add(self, output: RequestOutput) -> None:
        self.num_prompt_tokens = output.num_prompt_tokens
        self.num_generated_tokens = output.num_generated_tokens
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


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


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
