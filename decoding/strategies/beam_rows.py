"""A beam request inside the continuous batch: its rows, its KV slot moves, its final choices.

The search (``beam.BeamSearch`` or ``group_beam.GroupBeamSearch``) decides; ``BeamRows`` carries
the decisions out on the shared KV pool. A beam request holds ``num_beams`` slots and feeds one
decode row per beam. After each step every new beam must see its parent's cache: the first child
of a parent simply inherits the parent's slot, and only further children copy the parent's cache
into a slot a childless beam gave up, so a step copies at most the request's own rows and often
none (HF instead re-indexes the whole cache every step).

Beams can change until the search ends, so a beam request's text is released only at the end,
through the rows' streamers (stop strings are cut as in any other request).
"""

from __future__ import annotations

import time
from abc import abstractmethod
from typing import Protocol

import torch

from decoding.model.runner import RowInput
from decoding.outputs import FinishReason, TokenLogprob
from decoding.params.lengths import new_token_limit
from decoding.sampling.logprobs import token_logprob
from decoding.state.context import EngineContext
from decoding.state.request import Request
from decoding.strategies.base import DecodingStrategy, Fed, Pick


class BeamStepResult(Protocol):
    parents: list[int]
    tokens: list[int]
    done: bool


class Search(Protocol):
    """What ``BeamRows`` needs of a search: a step on the beams' logits, an early end, results."""

    def step(self, logits: torch.Tensor) -> BeamStepResult: ...

    def finish_now(self) -> None: ...

    def results(self, count: int) -> list: ...


class BeamRows(DecodingStrategy):
    def __init__(self, request: Request, ctx: EngineContext) -> None:
        super().__init__(request, ctx)
        params = request.params
        self.num_beams = params.num_beams
        self.slots: list[int] = []
        self.num_cached = 0  # tokens in every beam's slot (beams advance together)
        self.next_tokens: list[int] = []
        prompt_len = len(request.prompt_ids)  # GIT's image positions included: they take KV room, not max_length's
        self.max_new_tokens = min(new_token_limit(params, len(request.text_ids)), ctx.max_model_len - prompt_len)
        self.search = self.make_search()

    @abstractmethod
    def make_search(self) -> Search: ...

    def token_logprob(self, logits: torch.Tensor, token: int) -> TokenLogprob:
        return token_logprob(logits, token, self.request.params.logprobs, self.ctx.token_text)

    def logprob_fn(self):  # noqa: ANN201 - the search's per-token logprob callback, when asked
        return self.token_logprob if self.request.params.logprobs is not None else None

    def ends(self, generated_ids: list[int]) -> bool:
        return self.request.rows[0].stop.ends(generated_ids)

    # ---- slots ---------------------------------------------------------------------------------------
    @property
    def num_slots(self) -> int:
        return self.num_beams

    def assign_slots(self, slots: list[int]) -> None:
        self.slots = list(slots)

    def release_slots(self) -> list[int]:
        slots, self.slots = self.slots, []
        return slots

    def held_slots(self) -> list[int]:
        return list(self.slots)

    def cached_sequences(self) -> list[tuple[int, list[int]]]:
        """The prompt's blocks (registered as they were prefilled) are what beams share with others."""
        return []

    @property
    def prefill_slot(self) -> int:
        return self.slots[0]

    # ---- the step ------------------------------------------------------------------------------------
    def start(self, last_logits: torch.Tensor, last_chunk: RowInput) -> list[Pick]:
        self.num_cached = len(self.request.prompt_ids)
        # every beam is still the prompt itself: every parent's cache is the first slot
        self._advance(last_logits.expand(self.num_beams, -1), first=True)
        return []

    def plan(self) -> list[RowInput]:
        """One decode row per running beam: its last token at the beams' common length."""
        return [
            RowInput(slot, self.num_cached, [token], 0)
            for slot, token in zip(self.slots, self.next_tokens, strict=True)
        ]

    def consume(self, fed: list[Fed]) -> list[Pick]:
        self.num_cached += 1
        self._advance(torch.stack([logits[-1] for _, logits in fed]), first=False)
        return []

    def _advance(self, logits: torch.Tensor, *, first: bool) -> None:
        """Run one search step on ``logits`` ``[num_beams, vocab_size]``, then move the caches."""
        step = self.search.step(logits)
        old = self.slots
        sources = [old[0] if first else old[parent] for parent in step.parents]
        new_slots: list[int | None] = [None] * len(sources)
        inherited: set[int] = set()
        for j, source in enumerate(sources):
            if source not in inherited:
                new_slots[j] = source
                inherited.add(source)
        spare = [slot for slot in old if slot not in inherited]
        for j, source in enumerate(sources):
            if new_slots[j] is None:  # a second child of one parent: copy only this request's rows
                new_slots[j] = spare.pop()
                self.ctx.pool.copy_prefix(source, new_slots[j], self.num_cached)
        self.slots = new_slots
        self.next_tokens = step.tokens
        if step.done:
            self._finish()

    # ---- the end ------------------------------------------------------------------------------------
    def finish_now(self) -> None:
        if not self.request.finished:
            self.search.finish_now()
            self._finish()

    def _finish(self) -> None:
        """Hand the best ``n`` hypotheses to the request's rows, best first."""
        request = self.request
        params = request.params
        results = self.search.results(len(request.rows))
        total = 0
        for row in request.rows[len(results) :]:  # a search ended before its first step has none
            row.finish(FinishReason.LENGTH)
        for row, result in zip(request.rows, results, strict=False):
            ids = result.token_ids
            total += len(ids)
            row.output_ids = list(ids)
            row.pending_ids = list(ids)
            if params.logprobs is not None:
                row.pending_logprobs = result.logprobs
                row.sequence_score = result.score
            ends_with_token_stop = bool(ids) and row.stop.token_stop(ids[-1]) is not None
            row.streamer.put(ids[:-1] if ends_with_token_stop else ids)
            if not result.hit_stop:
                row.finish(FinishReason.LENGTH)
            elif ids and ids[-1] in params.stop_token_ids:
                row.finish(FinishReason.STOP, ids[-1])
            else:
                row.finish(FinishReason.STOP, row.streamer.stop_reason)
        now = time.monotonic()
        request.first_token_time = now
        self.ctx.observer.on_first_token(self.name, now - request.arrival_time)
        self.ctx.observer.on_tokens(self.name, total, [])
