"""Verifying draft tokens against the target: speculative sampling, greedy, and sample-and-match.

The target runs once over ``[last token] + drafts`` and gives k + 1 distributions: position i is
the target's distribution for the token after draft i - 1. These per-row functions decide how many
drafts to keep and which one extra token to emit, as HF's ``_assisted_decoding`` does
(transformers 5.23), but drawing from a per-request ``torch.Generator`` instead of the global RNG.

- ``speculative_sampling``: Leviathan et al. 2023 ("Fast Inference from Transformers via
  Speculative Decoding", Algorithm 1; HF's ``_speculative_sampling``). Drafts drawn from a known
  distribution q are kept with probability min(1, p/q); the first rejected position is redrawn
  from norm(max(p - q, 0)); if all are kept a bonus token comes from p[k]. Every emitted token is
  then distributed exactly as the target's p, whatever q is: the output is a sample of the target.
- ``greedy_verify``: keep drafts while they equal the target's argmax, then the target's argmax
  (HF's case 2, greedy). The output equals plain greedy decoding token for token.
- ``sample_and_match``: drafts without a distribution (prompt lookup, other tokenizers) under
  sampling: HF draws one token per position from p and keeps drafts while they equal the draws
  (HF's case 2 with ``do_sample``). Also distributed as p, but it accepts less than
  ``speculative_sampling``.
- ``crop_emitted``: HF's cut of the emitted tokens at ``max_length`` and at the first eos, after
  which HF counts ``n_matches = len(emitted) - 1`` (this is what its schedule sees).

The probabilities must be the processed ones (logits processors and warpers applied, then softmax),
for p exactly as a non-speculative step would sample them, for q as the drafts were drawn.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verification:
    """``num_accepted`` drafts kept, and the tokens to emit: those drafts plus one target token."""

    num_accepted: int
    token_ids: list[int]


def speculative_sampling(
    draft_ids: Sequence[int],
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> Verification:
    """Leviathan et al.'s rejection sampling for one row.

    ``draft_probs``: ``[k, vocab_size]`` q, the distributions the k drafts were drawn from;
    ``target_probs``: ``[k + 1, vocab_size]`` p. Consumes ``generator`` like HF consumes the global
    RNG: k uniforms in one call, then one multinomial draw, so with equal seeds the result equals
    HF's ``_speculative_sampling`` token for token.

    Divergences from HF: k = 0 is allowed (one token from p[0]); when the residual max(p - q, 0)
    sums to zero (only possible by rounding, p == q) the token is drawn from p instead of failing on
    a 0/0 distribution. A draft with q = 0 and p > 0 is kept (ratio inf), with q = p = 0 rejected
    (ratio nan), exactly as in HF.
    """
    num_drafts = len(draft_ids)
    _check_shapes(num_drafts, target_probs, draft_probs)
    if num_drafts == 0:
        return Verification(0, [_draw(target_probs[0], generator)])
    positions = torch.arange(num_drafts, device=target_probs.device)
    drafts = torch.tensor(list(draft_ids), dtype=torch.long, device=target_probs.device)
    p_draft = target_probs[positions, drafts]  # [k]
    q_draft = draft_probs[positions, drafts]  # [k]
    ratio = p_draft / q_draft  # [k] keep probability min(1, p/q)
    uniforms = torch.rand(num_drafts, generator=generator, device=ratio.device, dtype=ratio.dtype)
    kept = (uniforms <= ratio).tolist()
    num_accepted = kept.index(False) if False in kept else num_drafts
    if num_accepted < num_drafts:
        residual = (target_probs[num_accepted] - draft_probs[num_accepted]).clamp(min=0)  # [vocab_size]
        total = residual.sum()
        distribution = residual / total if float(total) > 0 else target_probs[num_accepted]
    else:
        distribution = target_probs[num_drafts]  # every draft kept: a bonus token from p
    token = _draw(distribution, generator)
    return Verification(num_accepted, [int(t) for t in draft_ids[:num_accepted]] + [token])


def greedy_verify(draft_ids: Sequence[int], target_scores: torch.Tensor) -> Verification:
    """Keep drafts while each equals the target's argmax at its position, then emit the target's
    argmax after the last kept one. ``target_scores``: ``[k + 1, vocab_size]`` processed scores
    (or probabilities: same argmax). Ties go to the lowest id, as ``torch.argmax`` and HF."""
    num_drafts = len(draft_ids)
    _check_shapes(num_drafts, target_scores)
    picks = target_scores.argmax(dim=-1).tolist()  # [k + 1]
    return _match(draft_ids, picks)


def sample_and_match(
    draft_ids: Sequence[int], target_probs: torch.Tensor, generator: torch.Generator | None = None
) -> Verification:
    """HF's verification for drafts without a draft distribution under sampling: one draw from p at
    every position (all k + 1 in one multinomial call, as HF), drafts kept while equal to the draw.
    ``target_probs``: ``[k + 1, vocab_size]``."""
    _check_shapes(len(draft_ids), target_probs)
    picks = torch.multinomial(target_probs, num_samples=1, generator=generator).squeeze(1).tolist()  # [k + 1]
    return _match(draft_ids, picks)


def crop_emitted(token_ids: Sequence[int], max_new: int, eos_token_ids: Collection[int] = ()) -> list[int]:
    """HF's crop of a round's emitted tokens: at most ``max_new`` (``max_length - cur_len``), and
    nothing after the first eos (the eos itself is kept). HF then recounts
    ``n_matches = len(result) - 1``, which is what its draft schedule is told."""
    kept = list(token_ids[: max(max_new, 0)])
    for i, token in enumerate(kept):
        if token in eos_token_ids:
            return kept[: i + 1]
    return kept


def _match(draft_ids: Sequence[int], picks: list[int]) -> Verification:
    num_accepted = 0
    while num_accepted < len(draft_ids) and int(draft_ids[num_accepted]) == picks[num_accepted]:
        num_accepted += 1
    return Verification(num_accepted, picks[: num_accepted + 1])


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, num_samples=1, generator=generator))


def _check_shapes(num_drafts: int, target: torch.Tensor, draft: torch.Tensor | None = None) -> None:
    if target.dim() != 2 or target.shape[0] != num_drafts + 1:
        raise ValueError(f"target distributions must be [num_drafts + 1, vocab_size], got {list(target.shape)}")
    if draft is not None and (draft.dim() != 2 or tuple(draft.shape) != (num_drafts, target.shape[1])):
        raise ValueError(f"draft distributions must be [num_drafts, vocab_size], got {list(draft.shape)}")
