"""A non-streaming response's outputs, accumulated per choice from the engine's deltas.

Every API's final body is built from these (``Collected`` per engine request, ``ChoiceState`` per
choice): the text, ids, logprobs and finish reason of each choice, and the token counts that usage
reports.
"""

from __future__ import annotations

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
    # how the deltas cut the text: (characters, tokens) each, so a whole reply's reasoning split counts its
    # tokens as the stream did (server.output.reasoning.split_reply)
    pieces: list[tuple[int, int]] = field(default_factory=list)


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
            choice.pieces.append((len(delta.text), len(delta.token_ids)))
            choice.token_ids.extend(delta.token_ids)
            choice.logprobs.extend(delta.logprobs or [])
            if delta.finish_reason is not None:
                choice.finish_reason = delta.finish_reason.value
            if delta.sequence_score is not None:
                choice.sequence_score = delta.sequence_score
