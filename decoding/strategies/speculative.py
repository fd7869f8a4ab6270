"""Speculative decoding for one row: where drafts come from, how many, and how they are checked.

Drafts come from the text so far (prompt lookup, Saxena 2023), from the target's own first layers
(self-speculative early exit, LayerSkip) or from a preloaded assistant model (Leviathan et al.
2023). Whatever proposes them, the target verifies ``[last token] + drafts`` as ONE multi-token
row of the shared batched forward, and the row picks each position's token exactly as it would
without speculation (processors, then argmax, or a draw from the request's own generator);
a draft is accepted while it equals that pick. So the output is the target's own greedy output,
or, for sampling, the same draws a non-speculative run with the same seed makes (the "sample and
match" rule: the target's distribution is preserved exactly). Rejected drafts roll back by a
length change of the KV slot; nothing is copied.

Speculation must never cost much: ``DraftLength`` follows HF's ``num_assistant_tokens_schedule``
and adds a back-off, so a row whose drafts keep failing stops drafting and only probes now and
then (exponentially rarer), which bounds the extra verification work.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from decoding.kv.pool import KVPool
from decoding.model.runner import RowInput
from decoding.params import GenerationParams
from decoding.sampling import RowSamplingState
from decoding.sampling.batch import SamplingBatch
from decoding.state.context import EngineContext
from decoding.state.request import Request, Row
from decoding.strategies.base import DraftJob, Pick
from decoding.strategies.plain import PlainDecoding
from decoding.strategies.universal import AssistantText

PROMPT_LOOKUP = "prompt_lookup"
EARLY_EXIT = "early_exit"


def propose_prompt_lookup(
    history: list[int], num_tokens: int, max_ngram_size: int, eos_token_ids: set[int]
) -> list[int]:
    """HF's ``PromptLookupCandidateGenerator``: the continuation of the first earlier occurrence of
    the longest trailing n-gram (n from ``max_ngram_size`` down to 1), cut before any eos."""
    length = len(history)
    for size in range(min(max_ngram_size, length - 1), 0, -1):
        tail = history[-size:]
        for start in range(length - size):  # left to right, excluding the tail itself
            if history[start : start + size] == tail:
                begin = start + size
                chosen = history[begin : min(begin + num_tokens, length)]
                if not chosen:
                    continue
                for i, token in enumerate(chosen):
                    if token in eos_token_ids:
                        return chosen[:i]
                return chosen
    return []


@dataclass
class DraftLength:
    """How many drafts to propose next: HF's schedule plus Decoda's back-off.

    HF (``AssistedCandidateGenerator.update_candidate_strategy``): "heuristic" grows the count by 2
    after a fully accepted draft and shrinks it by 1 (not below 1) otherwise; "constant" keeps it.

    Back-off, so speculation never costs much: a round is poor when it accepts under
    ``min_acceptance`` of its drafts, or when it did not pay for itself (the tokens it settled,
    accepted + 1, fewer than the target steps its drafting cost, ``1 + cost_steps``: a draft model
    slower than the target loses even at high acceptance). After ``patience`` poor rounds drafting
    pauses long enough that the wasted time stays under ``max_overhead`` of the decode time (at
    least 4 steps); every further poor probe doubles the pause (up to ``max_pause``); a good round
    resets it.
    """

    initial: int
    schedule: str = "heuristic"
    minimum: int = 1
    min_acceptance: float = 0.3
    patience: int = 2
    max_pause: int = 512
    max_overhead: float = 0.05
    verify_cost: float = 0.02  # extra target-step cost per verified draft token
    current: int = field(init=False)
    _poor_rounds: int = field(default=0, init=False)
    _pause: int = field(default=0, init=False)
    _next_pause: int = field(default=4, init=False)

    def __post_init__(self) -> None:
        self.current = self.initial

    def next(self, limit: int) -> int:
        """Drafts to propose this step (0 while backing off), at most ``limit``."""
        if self._pause > 0:
            self._pause -= 1
            return 0
        return max(0, min(self.current, limit))

    def update(self, num_drafted: int, num_accepted: int, cost_steps: float = 0.0) -> None:
        """``cost_steps``: the round's drafting time in units of a target decode step."""
        if num_drafted == 0:
            return
        if self.schedule in ("heuristic", "heuristic_transient"):
            if num_accepted == num_drafted:
                self.current += 2
            else:
                self.current = max(self.minimum, self.current - 1)
        # target steps this round lost, if positive: drafting time, plus a margin for verifying
        # the drafts in the target's forward (a wider row costs a little more than one token)
        wasted = (1 + 1.1 * cost_steps + self.verify_cost * num_drafted) - (num_accepted + 1)
        if num_accepted / num_drafted >= self.min_acceptance and wasted <= 0:
            self._poor_rounds = 0
            self._next_pause = 4
            return
        self._poor_rounds += 1
        if self._poor_rounds >= self.patience or wasted > 1:
            needed = int(max(wasted, 0) / self.max_overhead)
            self._pause = min(max(self._next_pause, needed), self.max_pause)
            self._next_pause = min(2 * self._pause, self.max_pause)
            self._poor_rounds = self.patience - 1  # one more poor probe pauses again, longer


@dataclass
class Speculation:
    """A row's speculative state: the proposer, the draft length, what was fed (counts live on the Row)."""

    proposer: str  # PROMPT_LOOKUP, EARLY_EXIT, or an assistant model's name
    length: DraftLength
    max_ngram_size: int = 2
    early_exit_layers: int = 0
    confidence_threshold: float | None = None  # stop drafting after a draft the proposer doubts
    drafts: list[int] = field(default_factory=list)  # fed this step, after the last token
    assistant_slot: int | None = None  # draft models: the row's slot in the assistant's pool
    assistant_pool: KVPool | None = None  # the pool that slot belongs to
    through_text: bool = False  # the assistant has another tokenizer: it realigns by its own ids
    assistant_cached: int = 0  # tokens of the history whose K/V the assistant holds
    assistant_ids: list[int] = field(default_factory=list)  # through-text assistants: their own ids
    text: AssistantText | None = None  # through-text assistants: the target's text as their ids
    draft_seconds: float = 0.0  # what this step's drafting took (shared by rows drafted together)
    draft_cost_steps: float = 0.0  # the same, estimated from the weights read: independent of load
    draft_probs: list = field(default_factory=list)  # sampled drafts: q per draft, [vocab_size] each

    def rollback(self, history_length: int) -> None:
        """After verification a same-vocabulary assistant keeps only K/V of tokens still in the
        history (a through-text assistant realigns by its own ids at the next draft instead)."""
        if not self.through_text:
            self.assistant_cached = min(self.assistant_cached, history_length)

    def release(self) -> None:
        if self.assistant_slot is not None:
            self.assistant_pool.free(self.assistant_slot)
            self.assistant_slot = None


def speculation_for(params: GenerationParams) -> Speculation:
    """A row's proposer and draft length from HF's knobs (defaults: 5 drafts, "heuristic")."""
    schedule = params.num_assistant_tokens_schedule or "heuristic"
    if params.prompt_lookup_num_tokens is not None:
        return Speculation(
            PROMPT_LOOKUP,
            DraftLength(params.prompt_lookup_num_tokens, "constant"),
            max_ngram_size=params.max_matching_ngram_size or 2,
        )
    length = DraftLength(params.num_assistant_tokens or 5, schedule)
    threshold = params.assistant_confidence_threshold
    if params.assistant_early_exit is not None:
        return Speculation(
            EARLY_EXIT, length, early_exit_layers=params.assistant_early_exit, confidence_threshold=threshold
        )
    return Speculation(params.assistant_model, length, confidence_threshold=threshold)


def rejection_sample(scores: torch.Tensor, draft: int, q: torch.Tensor, generator: torch.Generator) -> int:
    """Leviathan et al. 2023 (HF ``_speculative_sampling``): keep the draft with probability
    min(1, p(d) / q(d)), else draw from norm(max(p - q, 0)); the result is distributed as p."""
    p = torch.softmax(scores, dim=-1)  # [vocab_size] the target's processed distribution
    uniform = float(torch.rand(1, generator=generator, device=scores.device))
    if uniform * float(q[draft]) <= float(p[draft]):
        return draft
    residual = (p - q).clamp(min=0)
    total = float(residual.sum())
    residual = residual / total if total > 0 else p
    return int(torch.multinomial(residual, 1, generator=generator))


def verify_drafts(
    sampling: RowSamplingState,
    spec: Speculation,
    logits: torch.Tensor,
    commit: Callable[[int, torch.Tensor], bool],
) -> tuple[int, int]:
    """Settle the positions the target just ran for ``[last token] + spec.drafts``.

    ``logits``: ``[1 + num_drafts, vocab_size]``. Each position's token is picked as plain decoding
    would (or by rejection sampling for drafts drawn from a distribution) and handed to
    ``commit(token, logits_row)``, which returns True once the row finished; drafts are kept while
    they equal the pick. Returns (drafts accepted, tokens committed).
    """
    drafts, spec.drafts = spec.drafts, []
    draft_probs, spec.draft_probs = spec.draft_probs, []
    rejection = len(draft_probs) == len(drafts) and sampling.params.do_sample
    accepted = emitted = 0
    for i in range(len(drafts) + 1):
        scores = SamplingBatch.for_row(sampling).process(logits[i : i + 1])
        if rejection and i < len(drafts):
            token = rejection_sample(scores[0], drafts[i], draft_probs[i], sampling.generator)
        else:
            token = SamplingBatch.for_row(sampling).sample(scores)[0]
        finished = commit(token, logits[i])
        emitted += 1
        if finished or i == len(drafts) or token != drafts[i]:
            break
        accepted += 1
    return accepted, emitted


class SpeculativeDecoding(PlainDecoding):
    """Greedy or sampled decoding whose rows feed ``[last token] + drafts`` and verify them.

    The drafts are proposed by the engine's drafting stage for the ``draft_jobs`` of this step; a
    row that got none this step (backing off) is a plain row and picks through the batched sampler.
    """

    def __init__(self, request: Request, ctx: EngineContext) -> None:
        super().__init__(request, ctx)
        self.specs = {row.index: speculation_for(request.params) for row in request.rows}

    def draft_jobs(self) -> list[DraftJob]:
        jobs = []
        for row in self.request.rows:
            if row.finished:
                continue
            left = row.stop.max_new_tokens - len(row.output_ids) - 1
            room = self.ctx.max_model_len - row.num_cached - 2
            jobs.append(DraftJob(row, self.specs[row.index], min(left, room)))
        return jobs

    def plan(self) -> list[RowInput]:
        return [
            RowInput(row.slot, row.num_cached, [row.output_ids[-1], *self.specs[row.index].drafts], 0)
            for row in self.request.rows
            if not row.finished
        ]

    def consume_row(self, row: Row, row_input: RowInput, logits: torch.Tensor) -> Pick | None:
        if not self.specs[row.index].drafts:
            return super().consume_row(row, row_input, logits)
        self._verify(row, logits)
        return None

    def _verify(self, row: Row, logits: torch.Tensor) -> None:
        spec = self.specs[row.index]
        num_drafts = len(spec.drafts)
        start = row.num_cached
        now = time.monotonic()
        accepted, _ = verify_drafts(row.sampling, spec, logits, lambda token, raw: self.commit(row, token, raw, now))
        row.num_cached = start + 1 + accepted  # rejected drafts: a length change, no copy
        row.num_draft_tokens += num_drafts  # reported per request (usage.completion_tokens_details)
        row.num_accepted_draft_tokens += accepted
        spec.rollback(len(row.sampling.history) - 1)
        # A seeded request must draw the same tokens whatever the machine's load, and how many drafts
        # it proposes decides how many random numbers it uses: its back-off weighs the estimated cost,
        # never a measured one.
        if row.sampling.params.seed is not None:
            cost = spec.draft_cost_steps
        else:
            step_seconds = self.ctx.step_seconds
            cost = spec.draft_seconds / step_seconds if step_seconds else 0.0
        spec.length.update(num_drafts, accepted, cost)
        self.ctx.observer.on_speculation(spec.proposer, num_drafts, accepted)

    def release(self) -> None:
        for spec in self.specs.values():
            spec.release()
