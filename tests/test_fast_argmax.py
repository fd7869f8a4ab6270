"""The native greedy pick equals ``torch.argmax`` (first of equal maxima, NaN first) on every row."""

from __future__ import annotations

import pytest
import torch

from decoding.sampling import fast_argmax

pytestmark = pytest.mark.skipif(not fast_argmax.available(), reason="the row argmax kernel cannot be built here")


@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("width", [4096, 4099, 262144])
def test_it_equals_torch_argmax_on_random_rows(rows, width):
    torch.manual_seed(width + rows)
    scores = torch.randn(rows, width)
    assert torch.equal(fast_argmax.argmax_rows(scores), scores.argmax(dim=-1))


def test_ties_take_the_first_index_and_a_nan_wins_as_torch_has_it():
    scores = torch.full((4, 5000), -1.0)
    scores[0, [7, 4000]] = 3.0  # tie: the first
    scores[1, [4998, 4999]] = float("inf")  # in the tail past the last 16-wide load
    scores[2, 10] = 5.0
    scores[2, [100, 4999]] = float("nan")  # a NaN beats any number: the first NaN
    scores[3, :] = float("-inf")  # nothing but -inf: index 0
    assert torch.equal(fast_argmax.argmax_rows(scores), scores.argmax(dim=-1))
    assert fast_argmax.argmax_rows(scores).tolist() == [7, 4998, 100, 0]


def test_scores_it_does_not_take_go_to_torch():
    small = torch.randn(2, 100)  # a tiny vocabulary: torch's own
    assert torch.equal(fast_argmax.argmax_rows(small), small.argmax(dim=-1))
    half = torch.randn(2, 5000).to(torch.bfloat16)
    assert torch.equal(fast_argmax.argmax_rows(half), half.argmax(dim=-1))
    strided = torch.randn(5000, 2).t()  # not contiguous: made so first
    assert torch.equal(fast_argmax.argmax_rows(strided), strided.argmax(dim=-1))
