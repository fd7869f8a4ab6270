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

from decoding.params import MAX_CONTRASTIVE_TOP_K  # the KV pool's spare positions for candidates

__all__ = ["MAX_CONTRASTIVE_TOP_K", "ContrastiveSearch"]


class ContrastiveSearch:
    def __init__(self, penalty_alpha: float, top_k: int) -> None:
        self.alpha = penalty_alpha
        self.top_k = top_k
        self._context: torch.Tensor | None = None  # [capacity, hidden] normalised hidden states
        self._length = 0
        self.next_logits: torch.Tensor | None = None  # [vocab_size] raw logits for the next position
        self.candidates: list[int] = []
        self._candidate_probs: torch.Tensor | None = None  # [top_k]

    def start(self, prompt_hidden: torch.Tensor, last_logits: torch.Tensor) -> None:
        """``prompt_hidden``: ``[prompt_len, hidden]`` final hidden states of the prompt."""
        capacity = max(64, 2 * prompt_hidden.shape[0])
        self._context = prompt_hidden.new_empty((capacity, prompt_hidden.shape[1]))
        self._append(prompt_hidden)
        self.next_logits = last_logits

    def propose(self, processed_logits: torch.Tensor) -> list[int]:
        """Pick the candidates from the processed next-token scores (``[vocab_size]``)."""
        probs = torch.softmax(processed_logits, dim=-1)
        top_probs, top_ids = torch.topk(probs, k=self.top_k)
        self._candidate_probs = top_probs
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
