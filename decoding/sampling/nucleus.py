"""Top-p (nucleus) filtering without sorting the whole vocabulary.

HF's ``TopPLogitsWarper`` sorts every row ascending, takes the softmax of the sorted scores and its
running sum, and removes each token whose running sum (its own probability plus all smaller ones)
is at most ``1 - top_p``. On Gemma 3's 262,144 tokens that sort is ~30 ms a row (a one-row step of
the whole model is ~15 ms). Only the few tokens that survive need ordering: a token whose
probability is below a cut ``t`` is removed whenever everything below ``t`` together weighs at most
``1 - top_p`` (its own running sum can only be smaller). So each row is cut at the highest power
of two ``t`` that qualifies (read from one pass that weighs the probabilities by binary exponent),
only the tokens above it are sorted, and their running sums are the mass below ``t`` plus their own
ascending sums, in float64 then rounded to float32 as HF's float32 cumsum (CPU: a double accumulator) gives them. The
kept set is the same as HF's except where a running sum lies within float32 rounding of
``1 - top_p`` (the softmax of an unsorted row may differ from a sorted one's in the last bit),
where the token at the boundary, whose probability is then about that rounding, may go either way.

Small vocabularies (and a row with no qualifying cut, or a NaN row, which the pick then refuses:
``sampling.finite``) take HF's own sort, which is cheap there;
tests/test_nucleus.py checks both against HF's warper.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")
SORT_BELOW = 16384  # vocabularies up to this size: HF's full sort (a few hundred microseconds at most)


def top_p_sorted(scores: torch.Tensor, tail_mass: torch.Tensor, keep: int = 1) -> torch.Tensor:
    """HF's ``TopPLogitsWarper`` as it is: ``tail_mass`` ``[n, 1]`` is ``1 - top_p`` per row."""
    sorted_logits, sorted_indices = torch.sort(scores, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= tail_mass
    remove[..., -keep:] = False
    remove = remove.scatter(1, sorted_indices, remove)
    return scores.masked_fill(remove, NEG_INF)


def top_p(scores: torch.Tensor, tail_mass: torch.Tensor, keep: int = 1) -> torch.Tensor:
    """``top_p_sorted``'s result, sorting only the tokens that can survive."""
    if scores.shape[-1] <= SORT_BELOW or scores.device.type != "cpu":
        return top_p_sorted(scores, tail_mass, keep)
    probs = scores.float().softmax(dim=-1)
    out = torch.full_like(scores, NEG_INF)
    for row in range(scores.shape[0]):
        kept = _kept_tokens(probs[row], tail_mass[row, 0].float(), keep)
        if kept is None:
            out[row] = top_p_sorted(scores[row : row + 1], tail_mass[row : row + 1], keep)[0]
        else:
            out[row, kept] = scores[row, kept]
    return out


def _kept_tokens(probs: torch.Tensor, mass32: torch.Tensor, keep: int) -> torch.Tensor | None:
    """The indices one row keeps, or None when no cut qualifies (the full sort then). The cut is a
    power of two: one pass buckets the probabilities by their float32 exponent bits and weighs each
    bucket, and the cut is the highest bucket boundary with at most ``mass`` below it, so the tokens
    sorted are those within a factor of two of the smallest one kept, or above."""
    # biased exponent e: p in [2^(e-127), 2^(e-126)); the sign bit masked off (a NaN may carry it)
    exponents = ((probs.view(torch.int32) >> 23) & 0xFF).long()
    weights = torch.zeros(256, dtype=torch.float64, device=probs.device).scatter_add_(0, exponents, probs.double())
    below = weights.cumsum(0)  # below[e]: the mass of every probability under 2^(e-126)
    if not bool(torch.isfinite(below[-1])):  # a NaN row (NaN or +inf scores, or all -inf): HF's sort, which
        return None  # leaves it to the pick's check (sampling.finite) to refuse
    fits = (below <= float(mass32)).nonzero()
    if len(fits) == 0:
        return None
    bucket = int(fits[-1])
    cut = 2.0 ** (bucket - 126)
    candidates = (probs >= cut).nonzero().squeeze(1)
    if len(candidates) < keep:
        return None
    return _survivors(probs, candidates, float(below[bucket]), mass32, keep)


def _survivors(probs: torch.Tensor, candidates: torch.Tensor, below: float, mass32: torch.Tensor,
               keep: int) -> torch.Tensor:  # fmt: skip
    values, order = probs[candidates].sort()  # ascending, as HF's running sum goes
    running = (values.double().cumsum(0) + below).float()
    removed = running <= mass32
    removed[-keep:] = False
    return candidates[order[~removed]]
