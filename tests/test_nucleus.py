"""Top-p without a full sort keeps exactly the tokens HF's sorting warper keeps."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TopPLogitsWarper

from decoding.sampling import nucleus


def rows_of(kind: str, rows: int, vocab: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, vocab, generator=generator)
    if kind == "peaked":  # a model's usual shape: a few tokens carry the mass
        scores = scores * 3
        scores[:, :5] += 12
    elif kind == "flat":  # mass spread thin: the cut must come down far, or the sort takes over
        scores = scores * 0.01
    return scores


@pytest.mark.parametrize("kind", ["peaked", "normal", "flat"])
@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.99])
def test_the_kept_tokens_equal_hfs_warper(kind, top_p):
    scores = rows_of(kind, 3, 20_000, seed=int(top_p * 100))
    tail = torch.full((3, 1), 1 - top_p)
    ours = nucleus.top_p(scores, tail)
    theirs = TopPLogitsWarper(top_p)(None, scores.clone())
    assert_same_kept(scores, ours, theirs)
    assert torch.equal(ours[~ours.isinf()], scores[~ours.isinf()])  # kept scores untouched


def assert_same_kept(scores: torch.Tensor, ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """The same tokens kept, except among tokens of equal probability at the boundary, where HF's own
    (unstable) sort picks arbitrarily: then as many are kept, and the ones that differ tie."""
    assert torch.equal((~ours.isinf()).sum(-1), (~theirs.isinf()).sum(-1))
    differ = ours.isinf() != theirs.isinf()
    probs = scores.softmax(-1)
    for row in range(scores.shape[0]):
        assert probs[row][differ[row]].unique().numel() <= 1


def test_min_tokens_to_keep_and_per_row_thresholds():
    scores = rows_of("peaked", 4, 20_000, seed=3)
    scores[1, 7] = 40.0  # one token holds nearly all the mass: min_tokens_to_keep must add more
    tail = torch.tensor([[0.1], [0.5], [0.05], [0.3]])
    for keep in (1, 3):
        ours = nucleus.top_p(scores, tail, keep)
        assert_same_kept(scores, ours, nucleus.top_p_sorted(scores, tail, keep))
    assert int((~nucleus.top_p(scores, tail, 3)[1].isinf()).sum()) == 3


def test_small_vocabularies_take_hfs_sort(monkeypatch):
    called = []
    real = nucleus.top_p_sorted
    monkeypatch.setattr(nucleus, "top_p_sorted", lambda *a: called.append(1) or real(*a))
    scores = torch.randn(2, 1000)
    nucleus.top_p(scores, torch.full((2, 1), 0.2))
    assert called
