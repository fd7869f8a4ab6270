"""A row's thinking budget (``decoding.params.thinking``): where the row is in its thinking, and the
processor that forces the end tag once the budget is spent.

Each row keeps a ``ThinkingBudget`` beside its other sampling state, advanced by every token the
row commits (``RowSamplingState.append``), so every strategy that commits through it (plain rows,
beams, forks, a verification's positions one by one, contrastive candidates) keeps its own count.
The phases go one way: opening (only when the reply must open its own thinking: while its tokens
follow the opening tag's ids; any other token means the reply did not think, and the budget is
off), thinking (tokens counted from the reply's first), done (the end tag's ids were committed,
by the model or forced). Once a thinking row has committed ``thinking_budget`` tokens, each step
forces the next token of the end tag, continuing a tag the reply had already begun, so the thinking
ends within the budget plus the tag's length; then the row is free again.

``force_thinking_ends`` sets, for the rows whose budget forces a token now, every other score to
-inf and the forced one to 0. ``SamplingBatch.process`` calls it after every other processor and
before the warpers: the tag overrides earlier bans and biases (a grammar that wraps the answer after
the thinking, ``server.translate.structured``, admits the tag there anyway), and a one-token row
passes every warper unchanged.
"""

from __future__ import annotations

import torch

from decoding.params import GenerationParams

OPENING, THINKING, DONE = "opening", "thinking", "done"
NEG_INF = float("-inf")


class ThinkingBudget:
    """One row's place in its thinking (see the module's docstring)."""

    def __init__(self, budget: int, end_ids: list[int], start_ids: list[int] | None = None) -> None:
        self.budget = budget
        self.end_ids = list(end_ids)
        self.start_ids = list(start_ids) if start_ids else None
        self.phase = OPENING if self.start_ids else THINKING
        self.spent = 0  # the reply's tokens so far, while not done
        self.recent: list[int] = []  # the reply's last tokens, as many as the end tag has

    @classmethod
    def of(cls, params: GenerationParams) -> ThinkingBudget | None:
        if params.thinking_budget is None or not params.thinking_end_ids:
            return None
        return cls(params.thinking_budget, params.thinking_end_ids, params.thinking_start_ids)

    def fork(self) -> ThinkingBudget:
        twin = ThinkingBudget(self.budget, self.end_ids, self.start_ids)
        twin.phase, twin.spent, twin.recent = self.phase, self.spent, list(self.recent)
        return twin

    def append(self, token: int) -> None:
        if self.phase == DONE:
            return
        self.spent += 1
        if self.phase == OPENING:
            if token != self.start_ids[self.spent - 1]:
                self.phase = DONE  # the reply did not open a thinking block: nothing to end
            elif self.spent == len(self.start_ids):
                self.phase = THINKING
            return
        self.recent = (self.recent + [token])[-len(self.end_ids) :]
        if self.recent == self.end_ids:
            self.phase = DONE

    def forced(self) -> int | None:
        """The end tag's token this row must write next (None: the row is free this step)."""
        if self.phase != THINKING or self.spent < self.budget:
            return None
        for begun in range(min(len(self.end_ids) - 1, len(self.recent)), 0, -1):  # a tag already begun
            if self.recent[-begun:] == self.end_ids[:begun]:
                return self.end_ids[begun]
        return self.end_ids[0]


def force_thinking_ends(scores: torch.Tensor, rows: list[int], budgets: list[ThinkingBudget]) -> None:
    """In ``scores`` (``[num_rows, vocab_size]``), each of ``rows`` whose budget forces a token now
    keeps only that token (score 0); the others are untouched."""
    forced = [(i, token) for i, budget in zip(rows, budgets, strict=True) if (token := budget.forced()) is not None]
    if not forced:
        return
    index = torch.tensor([i for i, _ in forced], dtype=torch.long, device=scores.device)
    tokens = torch.tensor([t for _, t in forced], dtype=torch.long, device=scores.device)
    scores[index] = NEG_INF
    scores[index, tokens] = 0.0
