"""Greedy picks over a large vocabulary: ``torch.argmax(scores, dim=-1)``, computed faster on a CPU.

``row_argmax.cpp`` says why (torch's CPU argmax is ~20x slower than a max over the same row; on
Gemma 3's 262,144-token vocabulary that was ~0.5 ms of every one-row step). The operator is built
on first use like the other native kernels (``decoding.kv.native_kernel``); where it cannot be built,
or for scores it does not take (not float32 on a CPU), ``torch.argmax`` answers. Both give the first
index of equal maxima, and a NaN's index where a row has one (``tests/test_fast_argmax.py``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from decoding.kv.native_kernel import build_once

SOURCE = Path(__file__).with_name("row_argmax.cpp")
SMALL_VOCABULARY = 4096  # below this torch's own argmax costs a few microseconds: not worth a build


def argmax_rows(scores: torch.Tensor) -> torch.Tensor:
    """``scores.argmax(dim=-1)`` for ``[rows, vocabulary]`` scores."""
    if (
        scores.dim() == 2
        and scores.shape[1] >= SMALL_VOCABULARY
        and scores.dtype == torch.float32
        and scores.device.type == "cpu"
        and available()
    ):
        return torch.ops.decoda_sampling.argmax_rows(scores.contiguous())
    return scores.argmax(dim=-1)


available = build_once(SOURCE, "row_argmax", unavailable="row argmax kernel unavailable: greedy picks use torch.argmax")
