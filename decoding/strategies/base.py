"""The one interface through which the engine drives every request, whatever its strategy.

Each request holds one ``DecodingStrategy`` object. Every step the engine asks every running
request the same questions, in the same order, never which strategy it is:

1. ``draft_jobs()``  — rows that want draft tokens proposed before the forward (speculative);
2. ``plan()``        — the rows it feeds this step (``RowInput``: a decode row, sibling candidates,
                       a row with drafts, one row per beam); the prompt is fed in chunks by the
                       engine for every strategy alike, then handed over once through ``start``;
3. ``consume(fed)``  — what it makes of the logits (and hidden states) its rows got back: tokens
                       committed, KV lengths kept or rolled back, slots moved between beams. Rows
                       whose next token is a plain pick (greedy or a draw) come back as ``Pick``s,
                       which the engine samples for all requests in ONE batched pass and hands
                       back through ``accept``;
4. ``finished`` / ``finish_now()`` / ``release()`` — the end, normal or by a time limit.

Strategies never call the model: that is what lets them all share one forward.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from decoding.model.runner import RowInput
from decoding.outputs import FinishReason
from decoding.sampling.logprobs import token_logprob
from decoding.state.context import EngineContext
from decoding.state.request import Request, Row


@dataclass
class Pick:
    """A row whose next token the batched sampler picks from ``logits`` (``[vocab_size]``)."""

    strategy: DecodingStrategy
    row: Row
    logits: torch.Tensor


@dataclass
class DraftJob:
    """A row asking the drafting stage for at most ``limit`` drafts (``spec`` holds them)."""

    row: Row
    spec: object  # decoding.strategies.speculative.Speculation
    limit: int


Fed = tuple[RowInput, torch.Tensor]  # a row this strategy planned, and its logits [num_kept, vocab_size]


class DecodingStrategy(ABC):
    """One request's decoding method. Subclasses hold their own per-request state."""

    #: hidden states the runner should capture for this request's rows (HF ``hidden_states`` index)
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, request: Request, ctx: EngineContext) -> None:
        self.request = request
        self.ctx = ctx
        self.name = request.params.strategy.value

    # ---- KV slots --------------------------------------------------------------------------------
    @property
    def num_slots(self) -> int:
        """KV slots to hold while running (the scheduler admits when this many are free)."""
        return len(self.request.rows)

    def assign_slots(self, slots: list[int]) -> None:
        for row, slot in zip(self.request.rows, slots, strict=True):
            row.slot = slot

    def release_slots(self) -> list[int]:
        """Every slot of the target's pool this request holds, now given up."""
        slots = [row.slot for row in self.request.rows if row.slot is not None]
        for row in self.request.rows:
            row.slot = None
        return slots

    def held_slots(self) -> list[int]:
        """Every row of the target's pool this request holds now (preemption swaps them out)."""
        return [row.slot for row in self.request.rows if row.slot is not None]

    def cached_sequences(self) -> list[tuple[int, list[int]]]:
        """(row, the tokens whose K/V it holds from position 0): offered to the prefix cache at the end."""
        return [(row.slot, row.sampling.history[: row.num_cached]) for row in self.request.rows if row.slot is not None]

    @property
    def reuses_prefix(self) -> bool:
        """Whether the prompt may start from cached blocks: not when every prompt position's
        logits are wanted (prompt logprobs), which a cached block does not keep."""
        return self.request.params.prompt_logprobs is None

    @property
    def prefill_slot(self) -> int:
        """The slot the prompt is written into; other rows copy it once it is complete."""
        return self.request.rows[0].slot

    def release(self) -> None:
        """Give up anything held outside the target's pool (an assistant's slots)."""
        return None

    # ---- the step ----------------------------------------------------------------------------------
    def draft_jobs(self) -> list[DraftJob]:
        return []

    def consume_prompt_chunk(self, chunk: RowInput) -> None:
        """A prompt chunk was just run (its hidden states are in ``chunk.hidden``)."""
        return None

    @abstractmethod
    def start(self, last_logits: torch.Tensor, last_chunk: RowInput) -> list[Pick]:
        """The prompt is complete: ``last_logits`` (``[vocab_size]``) predict the first token."""

    @abstractmethod
    def plan(self) -> list[RowInput]:
        """The rows this request feeds to this step's forward (called once the prompt is in)."""

    @abstractmethod
    def consume(self, fed: list[Fed]) -> list[Pick]:
        """Settle the rows ``plan`` fed, in the same order."""

    def accept(self, row: Row, token: int, logits: torch.Tensor, now: float) -> None:
        """The batched sampler picked ``token`` for a ``Pick`` of this request."""
        self.commit(row, token, logits, now)

    # ---- the end ------------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.request.finished

    def finish_now(self) -> None:
        """A time limit passed: end every row as it stands, as HF's ``MaxTimeCriteria`` does."""
        for row in self.request.rows:
            row.finish(FinishReason.LENGTH)

    # ---- shared by the strategies -------------------------------------------------------------------
    def commit(self, row: Row, token: int, logits: torch.Tensor, now: float | None = None) -> bool:
        """Append one token to ``row`` (``logits``: the raw ``[vocab_size]`` it came from, for
        logprobs); returns True when the row has finished."""
        now = time.monotonic() if now is None else now
        request = self.request
        if request.first_token_time is None:
            request.first_token_time = now
            self.ctx.observer.on_first_token(self.name, now - request.arrival_time)
        gaps = [now - row.last_token_time] if row.last_token_time is not None else []
        row.last_token_time = now
        num_top = request.params.logprobs
        logprob = None if num_top is None else token_logprob(logits, token, num_top, self.ctx.token_text)
        row.append(token, logprob)
        self.ctx.observer.on_tokens(self.name, 1, gaps)
        return row.finished

    def copy_prompt_to_rows(self) -> None:
        """Every row starts from the prompt: rows other than the first copy its K/V once."""
        first = self.request.rows[0]
        length = len(self.request.prompt_ids)
        for row in self.request.rows:
            if row is not first:
                self.ctx.pool.copy_prefix(first.slot, row.slot, length)
            row.num_cached = length
