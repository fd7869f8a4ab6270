"""Rows no token can be picked from: their scores hold a NaN, or every token's is -inf.

A NaN anywhere in a row makes its softmax NaN everywhere, and a row of -inf has no probability to
draw from: greedy's argmax would return the NaN's index (or token 0), a multinomial draw raises,
and top-p's exponent buckets would index out of bounds. Finite model logits get there only
through a request's own knobs (a temperature or repetition penalty that overflows), a model that
overflowed, or bans covering every token; either way it is that request's failure (a 400), never a
500, and never its batch neighbours'. Every picker checks its rows before it draws anything
(``SamplingBatch.sample``, beam search's step), so the other rows' seeded generators are untouched
and the engine picks them again, without the failed request, to the same tokens
(``engine.sample_stage``).
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


class NonFiniteScores(ValueError):
    """No token can be picked from ``rows`` (indices into the batch that was being picked): the request
    that owns them fails as a bad request (400), not a server error."""

    def __init__(self, rows: list[int], message: str | None = None) -> None:
        super().__init__(message or "no token can be picked: the scores are NaN or every token's is -inf (the "
                         "model's output, or the request's knobs overflowing, e.g. a repetition_penalty or "
                         "temperature so small it overflows)")  # fmt: skip
        self.rows = rows


def unpickable(scores: torch.Tensor) -> list[int]:
    """The rows of ``scores`` ``[n, vocab]`` (scores or probabilities) whose largest value is NaN or -inf:
    ``amax`` propagates a NaN, and a NaN compares false with anything."""
    if scores.numel() == 0:
        return []
    return _rows(~(scores.amax(dim=-1) > NEG_INF))


def unpickable_picks(scores: torch.Tensor, picked: torch.Tensor) -> list[int]:
    """Greedy's check, one value a row: a row whose argmax ``picked`` holds a NaN or -inf (the argmax
    returns a NaN's index when a row has one, and a -inf only when every token is -inf)."""
    if picked.numel() == 0:
        return []
    return _rows(~(scores.gather(1, picked.view(-1, 1)).squeeze(1) > NEG_INF))


def _rows(bad: torch.Tensor) -> list[int]:
    return bad.nonzero().flatten().tolist() if bool(bad.any()) else []
