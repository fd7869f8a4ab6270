"""Draft verification: speculative sampling preserves the target distribution (chi-square on a tiny
vocabulary, fixed seeds) and equals HF's ``_speculative_sampling`` draw for draw; greedy
verification and HF's crop of the emitted tokens."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.utils import _speculative_sampling

from decoding.sampling.speculative import (
    Verification,
    crop_emitted,
    greedy_verify,
    sample_and_match,
    speculative_sampling,
)

V = 6
# the target: the first token's distribution, and the second's given the first
P1 = torch.tensor([0.30, 0.05, 0.25, 0.10, 0.20, 0.10])
P2 = torch.tensor(
    [
        [0.50, 0.10, 0.10, 0.10, 0.10, 0.10],
        [0.05, 0.05, 0.30, 0.30, 0.25, 0.05],
        [0.10, 0.40, 0.05, 0.05, 0.10, 0.30],
        [0.20, 0.20, 0.20, 0.20, 0.10, 0.10],
        [0.05, 0.10, 0.15, 0.20, 0.25, 0.25],
        [0.30, 0.05, 0.05, 0.30, 0.05, 0.25],
    ]
)
# the drafter disagrees a lot: most of its mass where the target has little
Q1 = torch.tensor([0.05, 0.40, 0.05, 0.30, 0.05, 0.15])
Q2 = P2.flip(1)
Q_LATER = torch.tensor([0.5, 0.1, 0.1, 0.1, 0.1, 0.1])
UNIFORM = torch.full((V,), 1 / V)


def target(context: list[int]) -> torch.Tensor:
    return P1 if not context else P2[context[0]] if len(context) == 1 else UNIFORM


def drafter(context: list[int]) -> torch.Tensor:
    return Q1 if not context else Q2[context[0]] if len(context) == 1 else Q_LATER


def first_two_tokens(verify, generator: torch.Generator, num_drafts: int = 2) -> tuple[int, int]:
    """Generate until two tokens exist: each round drafts ``num_drafts`` tokens from the drafter,
    the target scores ``[last] + drafts`` (k + 1 distributions), ``verify`` settles them."""
    emitted: list[int] = []
    while len(emitted) < 2:
        context, drafts, q_rows, p_rows = list(emitted), [], [], []
        for _ in range(num_drafts):
            q = drafter(context)
            p_rows.append(target(context))
            q_rows.append(q)
            drafts.append(int(torch.multinomial(q, 1, generator=generator)))
            context.append(drafts[-1])
        p_rows.append(target(context))
        emitted += verify(drafts, torch.stack(q_rows), torch.stack(p_rows), generator).token_ids
    return emitted[0], emitted[1]


def chi_square(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    expected = expected_probs * observed.sum()
    return float(((observed - expected) ** 2 / expected).sum())


def joint_counts(verify, num_samples: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V, V)
    for _ in range(num_samples):
        first, second = first_two_tokens(verify, generator)
        counts[first, second] += 1
    return counts


def resample_from_p(drafts, q, p, generator) -> Verification:
    """A classic bug: on rejection, draw from p instead of norm(max(p - q, 0))."""
    ratio = p[range(len(drafts)), drafts] / q[range(len(drafts)), drafts]
    uniforms = torch.rand(len(drafts), generator=generator)
    kept = 0
    while kept < len(drafts) and uniforms[kept] <= ratio[kept]:
        kept += 1
    return Verification(kept, list(drafts[:kept]) + [int(torch.multinomial(p[kept], 1, generator=generator))])


# chi-square thresholds, far in the tails (p < 1e-4) for 5 and 35 degrees of freedom; the seeds are
# fixed, so the test is deterministic, and the thresholds only need to be honest
CHI2_DF5 = 25.7
CHI2_DF35 = 74.0


def test_first_and_second_tokens_follow_the_target_distribution():
    counts = joint_counts(speculative_sampling, 8_000, seed=0)
    joint = P1[:, None] * P2  # [V, V] the target's probability of (first, second)
    assert chi_square(counts.sum(1), P1) < CHI2_DF5
    assert chi_square(counts.sum(0), joint.sum(0)) < CHI2_DF5
    assert chi_square(counts.flatten(), joint.flatten()) < CHI2_DF35


def test_the_chi_square_check_catches_a_biased_verifier():
    generator = torch.Generator().manual_seed(1)
    firsts = torch.zeros(V)
    for _ in range(3000):
        first, _ = first_two_tokens(resample_from_p, generator, num_drafts=1)
        firsts[first] += 1
    assert chi_square(firsts, P1) > 10 * CHI2_DF5


def test_matches_hf_speculative_sampling_draw_for_draw():
    logits_generator = torch.Generator().manual_seed(2)
    num_rejected = num_all_accepted = 0
    for seed in range(80):  # HF's function takes ~15 ms a call on CPU
        k = 1 + seed % 5
        target_logits = 2 * torch.randn(1, k + 1, 9, generator=logits_generator)  # [1, k + 1, vocab]
        draft_logits = 2 * torch.randn(1, k, 9, generator=logits_generator)  # [1, k, vocab]
        if seed % 3 == 0:
            draft_logits = target_logits[:, :k] + 0.3 * torch.randn(1, k, 9, generator=logits_generator)
        drafts = torch.multinomial(draft_logits[0].softmax(-1), 1, generator=logits_generator)[:, 0]  # [k]
        candidate_input_ids = torch.cat([torch.tensor([[7, 8]]), drafts[None]], dim=1)
        torch.manual_seed(seed)
        hf_tokens, hf_matches = _speculative_sampling(candidate_input_ids, draft_logits, k, target_logits)
        ours = speculative_sampling(
            drafts.tolist(),
            draft_logits[0].softmax(-1),
            target_logits[0].softmax(-1),
            torch.Generator().manual_seed(seed),
        )
        assert (ours.num_accepted, ours.token_ids) == (int(hf_matches), hf_tokens[0].tolist())
        num_rejected += ours.num_accepted < k
        num_all_accepted += ours.num_accepted == k
    assert num_rejected > 15 and num_all_accepted > 8  # both branches compared


def test_speculative_sampling_edge_cases():
    generator = torch.Generator().manual_seed(3)
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    # a draft the target cannot produce is always rejected, the replacement drawn from max(p - q, 0)
    result = speculative_sampling([0], torch.tensor([[1.0, 0.0, 0.0]]), p, generator)
    assert result == Verification(0, [1])
    # a sure draft is kept and the bonus token comes from p[k]
    assert speculative_sampling([1], torch.tensor([[0.0, 1.0, 0.0]]), p, generator) == Verification(1, [1, 2])
    # no drafts: one token from p[0]
    assert speculative_sampling([], torch.zeros(0, 3), p[:1], generator) == Verification(0, [1])
    # a residual that is all zero (q above p everywhere: q not normalised) falls back to p
    q = torch.tensor([[0.5, 1.0, 0.5]])
    for _ in range(20):
        assert speculative_sampling([1], q, torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]]), generator).token_ids[
            -1
        ] in (0, 1, 2)
    with pytest.raises(ValueError):
        speculative_sampling([1, 2], torch.zeros(2, 3), torch.zeros(2, 3), generator)
    with pytest.raises(ValueError):
        speculative_sampling([1], torch.zeros(1, 4), torch.zeros(2, 3), generator)


def test_speculative_sampling_is_reproducible_per_generator():
    q = torch.stack([Q1, Q_LATER])
    p = torch.stack([P1, P2[1], UNIFORM])
    runs = [
        [speculative_sampling([1, 3], q, p, generator) for _ in range(30)]
        for generator in (torch.Generator().manual_seed(9), torch.Generator().manual_seed(9))
    ]
    assert runs[0] == runs[1]


# --- greedy ----------------------------------------------------------------------------------------


def one_hot_scores(picks: list[int], vocab_size: int = 8) -> torch.Tensor:
    scores = torch.randn(len(picks), vocab_size, generator=torch.Generator().manual_seed(len(picks)))
    scores[range(len(picks)), picks] = 10.0
    return scores  # [k + 1, vocab_size]


def test_greedy_verify_accepts_the_matching_prefix_and_adds_the_target_token():
    assert greedy_verify([3, 4, 5], one_hot_scores([3, 4, 5, 6])) == Verification(3, [3, 4, 5, 6])
    assert greedy_verify([3, 4, 5], one_hot_scores([3, 1, 5, 6])) == Verification(1, [3, 1])
    assert greedy_verify([3, 4, 5], one_hot_scores([2, 4, 5, 6])) == Verification(0, [2])
    assert greedy_verify([], one_hot_scores([7])) == Verification(0, [7])
    # a later match after a mismatch does not count
    assert greedy_verify([1, 2, 3], one_hot_scores([1, 0, 3, 4])) == Verification(1, [1, 0])
    # ties go to the lowest id, like torch.argmax and HF
    assert greedy_verify([2], torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]])) == Verification(0, [1])
    with pytest.raises(ValueError):
        greedy_verify([1, 2], one_hot_scores([1, 2]))


def test_greedy_verify_equals_plain_greedy_on_a_toy_model():
    """Speculative greedy with arbitrary drafts emits exactly what one-token-at-a-time greedy does."""
    table = torch.randn(V, V, V, generator=torch.Generator().manual_seed(4))  # next-token logits per (a, b)

    def logits(context: list[int]) -> torch.Tensor:
        return table[context[-2], context[-1]]

    plain = [1, 2]
    while len(plain) < 40:
        plain.append(int(logits(plain).argmax()))
    generator = torch.Generator().manual_seed(5)
    speculative = [1, 2]
    while len(speculative) < 40:
        drafts = torch.randint(V, (int(torch.randint(0, 4, (1,), generator=generator)),), generator=generator)
        if len(drafts) and bool(torch.rand(1, generator=generator) < 0.5):
            drafts[0] = plain[len(speculative)]  # some right drafts too
        rows = [logits(speculative + drafts[:i].tolist()) for i in range(len(drafts) + 1)]
        speculative += greedy_verify(drafts.tolist(), torch.stack(rows)).token_ids
    assert speculative[:40] == plain


# --- sample and match, crop -------------------------------------------------------------------------


def test_sample_and_match_keeps_drafts_equal_to_the_draws():
    p = torch.stack([P1, P2[0], UNIFORM])
    draws = torch.multinomial(p, 1, generator=torch.Generator().manual_seed(6))[:, 0].tolist()
    result = sample_and_match([draws[0], (draws[1] + 1) % V], p, torch.Generator().manual_seed(6))
    assert result == Verification(1, draws[:2])
    result = sample_and_match(draws[:2], p, torch.Generator().manual_seed(6))
    assert result == Verification(2, draws)


def test_crop_emitted_like_hf_max_length_and_eos():
    assert crop_emitted([5, 6, 7], max_new=2) == [5, 6]
    assert crop_emitted([5, 0, 7], max_new=5, eos_token_ids={0}) == [5, 0]
    assert crop_emitted([0, 0], max_new=5, eos_token_ids={0}) == [0]
    assert crop_emitted([5, 6, 0], max_new=2, eos_token_ids={0}) == [5, 6]
    assert crop_emitted([5], max_new=0) == []
