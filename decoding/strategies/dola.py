"""DoLa, Decoding by Contrasting Layers (Chuang et al. 2024), for one row.

The next-token logits are the final layer's log-probabilities minus those of a "premature" layer,
chosen per step among candidate layers as the one whose distribution is furthest (Jensen-Shannon)
from the final one, under the adaptive plausibility constraint (tokens below 10% of the top
token's probability are dropped). Matches transformers 4.x's ``_dola_decoding``,
``_dola_select_contrast`` and ``_relative_top_filter``: the premature logits are the LM head
applied to the un-normed hidden state ``hidden_states[layer]`` (0 = the embeddings), and the
layer choice for ``"low"``/``"high"`` is HF's. The usual processors (repetition_penalty 1.2 is
the paper's advice) then apply to the contrasted logits, greedy or sampled. Only the candidate
layers' hidden states at the last position ever go through the LM head.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from decoding.model.runner import RowInput
from decoding.state.context import EngineContext
from decoding.state.request import Request
from decoding.strategies.plain import PlainDecoding


def dola_candidate_layers(dola_layers: str | list[int], num_layers: int, tied_embeddings: bool) -> list[int]:
    """HF 4.x's premature-layer candidates; the embedding output (0) is skipped when tied."""
    if not tied_embeddings:
        start = 0
    elif num_layers > 2:
        start = 2
    elif num_layers == 2:
        start = 1
    else:
        start = 0
    if dola_layers == "low":
        if start == num_layers // 2:
            return [start]
        return list(range(start, num_layers // 2, 2)) if num_layers <= 40 else list(range(start, 20, 2))
    if dola_layers == "high":
        if num_layers <= 40:
            return list(range(num_layers // 2, num_layers, 2))
        return list(range(num_layers - 20, num_layers, 2))
    return [i for i in dola_layers if i < num_layers]


def _relative_top_filter(
    scores: torch.Tensor, baseline: torch.Tensor, relative_top: float = 0.1
) -> tuple[torch.Tensor, torch.Tensor]:
    scores = scores.log_softmax(dim=-1)
    baseline = baseline.log_softmax(dim=-1)
    best = scores.max(dim=-1).values  # HF sorts to read the top entry; the max is the same number
    threshold = torch.min(best, best + math.log(relative_top))
    below = scores < threshold.unsqueeze(-1)
    baseline[below] = -1e-3
    scores[below] = float("-inf")
    return scores, baseline


def dola_contrast(final_logits: torch.Tensor, premature_logits: dict[int, torch.Tensor]) -> torch.Tensor:
    """``final_logits``: ``[1, vocab_size]``; ``premature_logits``: layer -> ``[1, vocab_size]``
    (in candidate order). Returns the contrasted ``[1, vocab_size]`` logits."""
    layers = list(premature_logits)
    if len(layers) == 1:
        final, base = _relative_top_filter(final_logits, premature_logits[layers[0]])
        return final - base
    stacked = torch.stack([premature_logits[i] for i in layers], dim=0)  # [num_layers, 1, vocab_size]
    mature_probs = F.softmax(final_logits, dim=-1)
    premature_probs = F.softmax(stacked, dim=-1)
    average = 0.5 * (mature_probs[None, :, :] + premature_probs)
    kl_mature = F.kl_div(F.log_softmax(final_logits, dim=-1)[None, :, :], average, reduction="none").mean(-1)
    kl_premature = F.kl_div(F.log_softmax(stacked, dim=-1), average, reduction="none").mean(-1)
    js_divergence = (0.5 * (kl_mature + kl_premature)).mean(-1)  # [num_layers]
    premature = layers[int(js_divergence.argmax().item())]
    final, base = _relative_top_filter(final_logits, premature_logits[premature])
    return final - base


class DolaDecoding(PlainDecoding):
    """Greedy or sampled decoding whose next-token logits are DoLa's contrast."""

    def __init__(self, request: Request, ctx: EngineContext) -> None:
        super().__init__(request, ctx)
        layers = dola_candidate_layers(request.params.dola_layers, ctx.num_layers, ctx.tied_embeddings)
        self.layers = layers
        self.hidden_layers = tuple(layers)

    def next_logits(self, logits: torch.Tensor, row_input: RowInput) -> torch.Tensor:
        # one LM-head matmul for all candidate layers at the last position: the head is read once
        stacked = torch.cat([row_input.hidden[layer][-1:] for layer in self.layers])  # [num_layers, hidden]
        projected = self.ctx.lm_head(stacked).float()  # [num_layers, vocab_size]
        premature = {layer: projected[i : i + 1] for i, layer in enumerate(self.layers)}
        return dola_contrast(logits[-1:], premature)[0]
