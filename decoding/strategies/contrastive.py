"""Contrastive search for one row (Su et al. 2022, "A Contrastive Framework for Neural Text Generation").

Each step scores the ``top_k`` most probable next tokens by
``(1 - penalty_alpha) * p(token) - penalty_alpha * max cos(h_token, h_previous)``, where the
degeneration penalty is the largest cosine similarity between the candidate's last hidden state
and those of every earlier token (prompt included). This follows transformers 4.x's
``_contrastive_search`` / ``_ranking_fast`` exactly. HF copies the whole KV cache ``top_k`` times
per step to run the candidates; here the candidates are ONE multi-token row of sibling tokens at
the same position (each attends to the prefix and itself only, ``attention.Segment.siblings``),
and only the chosen candidate's K/V is kept (one position moved, nothing copied per candidate).
The model is never called here: the engine feeds ``candidates`` and hands back their logits and
final hidden states.
"""

from __future__ import annotations

import torch

from decoding.model.runner import RowInput
from decoding.params import MAX_CONTRASTIVE_TOP_K  # the KV pool's spare positions for candidates
from decoding.sampling.batch import SamplingBatch
from decoding.state.context import EngineContext
from decoding.state.request import Request, Row
from decoding.strategies.base import DecodingStrategy, Fed, Pick

__all__ = ["MAX_CONTRASTIVE_TOP_K", "ContrastiveDecoding", "ContrastiveSearch"]


class ContrastiveSearch:
    def __init__(self, penalty_alpha: float, top_k: int) -> None:
        self.alpha = penalty_alpha
        self.top_k = top_k
        self._context: torch.Tensor | None = None  # [capacity, hidden] normalised hidden states
        self._length = 0
        self.next_logits: torch.Tensor | None = None  # [vocab_size] raw logits for the next position
        self.candidates: list[int] = []
        self._candidate_probs: torch.Tensor | None = None  # [top_k]
        self._banned: torch.Tensor | None = None  # [top_k] bool, under a structured output's grammar

    def start(self, prompt_hidden: torch.Tensor, last_logits: torch.Tensor) -> None:
        """``prompt_hidden``: ``[prompt_len, hidden]`` final hidden states of the prompt."""
        capacity = max(64, 2 * prompt_hidden.shape[0])
        self._context = prompt_hidden.new_empty((capacity, prompt_hidden.shape[1]))
        self._append(prompt_hidden)
        self.next_logits = last_logits

    def propose(self, processed_logits: torch.Tensor, constrained: bool = False) -> list[int]:
        """Pick the candidates from the processed next-token scores (``[vocab_size]``).

        ``constrained``: a structured output's grammar masked the scores; when it allows fewer
        tokens than ``top_k``, the banned ones that fill the top k are never chosen (HF would rank
        a zero-probability candidate by its degeneration penalty alone)."""
        probs = torch.softmax(processed_logits, dim=-1)
        top_probs, top_ids = torch.topk(probs, k=self.top_k)
        self._candidate_probs = top_probs
        self._banned = torch.isneginf(processed_logits[top_ids]) if constrained else None  # [top_k]
        self.candidates = top_ids.tolist()
        return self.candidates

    def select(self, candidate_logits: torch.Tensor, candidate_hidden: torch.Tensor) -> int:
        """Rank the fed candidates; returns the chosen index into ``candidates``.

        ``candidate_logits``: ``[top_k, vocab_size]``; ``candidate_hidden``: ``[top_k, hidden]``.
        """
        context = self._context[: self._length]  # [seq_len, hidden], already normalised
        normed = candidate_hidden / candidate_hidden.norm(dim=-1, keepdim=True)
        cosine = (context @ normed.T).T  # [top_k, seq_len]
        degeneration_penalty = cosine.max(dim=-1).values  # [top_k]
        score = (1.0 - self.alpha) * self._candidate_probs - self.alpha * degeneration_penalty
        if self._banned is not None:
            score = score.masked_fill(self._banned, float("-inf"))
        chosen = int(score.max(dim=-1).indices)
        self._append(candidate_hidden[chosen : chosen + 1])
        self.next_logits = candidate_logits[chosen]
        return chosen

    def _append(self, hidden: torch.Tensor) -> None:
        needed = self._length + hidden.shape[0]
        if needed > self._context.shape[0]:
            grown = self._context.new_empty((2 * needed, self._context.shape[1]))
            grown[: self._length] = self._context[: self._length]
            self._context = grown
        self._context[self._length : needed] = hidden / hidden.norm(dim=-1, keepdim=True)
        self._length = needed


class ContrastiveDecoding(DecodingStrategy):
    """Each row feeds its ``top_k`` candidates as siblings; the winner's K/V is kept in place."""

    def __init__(self, request: Request, ctx: EngineContext) -> None:
        super().__init__(request, ctx)
        self.hidden_layers = (ctx.num_layers,)
        params = request.params
        self.searches = {row.index: ContrastiveSearch(params.penalty_alpha, params.top_k) for row in request.rows}
        self._prompt_hidden: list[torch.Tensor] = []  # final hidden states per prompt chunk

    @property
    def reuses_prefix(self) -> bool:
        """The degeneration penalty compares against every prompt position's hidden state, which
        a cached block does not keep: the prompt is always computed (its blocks are still offered)."""
        return False

    def consume_prompt_chunk(self, chunk: RowInput) -> None:
        self._prompt_hidden.append(chunk.hidden[self.ctx.num_layers])

    def start(self, last_logits: torch.Tensor, last_chunk: RowInput) -> list[Pick]:
        self.copy_prompt_to_rows()
        prompt_hidden = torch.cat(self._prompt_hidden)  # [prompt_len, hidden]
        self._prompt_hidden = []
        for row in self.request.rows:
            self.searches[row.index].start(prompt_hidden, last_logits)
            self._propose(row)
        return []

    def plan(self) -> list[RowInput]:
        return [
            RowInput(row.slot, row.num_cached, self.searches[row.index].candidates, 0, True, self.hidden_layers)
            for row in self._live_rows()
        ]

    def consume(self, fed: list[Fed]) -> list[Pick]:
        """Rank each row's candidates just run, keep the winner's K/V, commit it, propose the next."""
        for row, (row_input, logits) in zip(self._live_rows(), fed, strict=True):
            search = self.searches[row.index]
            distribution = search.next_logits  # the raw logits the candidates were drawn from
            chosen = search.select(logits, row_input.hidden[self.ctx.num_layers])
            if chosen:
                self.ctx.pool.move_position(row.slot, row.num_cached + chosen, row.num_cached)
            row.num_cached += 1
            if not self.commit(row, search.candidates[chosen], distribution):
                self._propose(row)
        return []

    def _live_rows(self) -> list[Row]:
        return [row for row in self.request.rows if not row.finished]

    def _propose(self, row: Row) -> None:
        search = self.searches[row.index]
        scores = SamplingBatch.for_row(row.sampling).process(search.next_logits[None])[0]
        # a grammar or a forced end of thinking bans tokens: a banned candidate is never chosen
        search.propose(scores, constrained=row.sampling.grammar is not None or row.sampling.thinking is not None)
