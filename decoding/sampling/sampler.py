"""The engine's batched pick: every plain row of every request processed and picked in one pass.

Building a ``SamplingBatch`` turns per-row parameters into per-knob tensors; the rows picked
together rarely change from one step to the next, so the batch is kept while they stay the same.
"""

from __future__ import annotations

import torch

from decoding.sampling.batch import SamplingBatch
from decoding.sampling.row_state import RowSamplingState


class BatchSampler:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._key: tuple[int, ...] = ()
        self._batch: SamplingBatch | None = None

    def pick(self, rows: list[RowSamplingState], logits: torch.Tensor) -> list[int]:
        """``logits``: ``[len(rows), vocab_size]`` raw; returns one token per row. Rows that set
        ``renormalize_logits`` get their processed scores written back into ``logits``, for their logprobs."""
        key = tuple(id(row) for row in rows)
        if key != self._key or self._batch is None:
            self._batch = SamplingBatch(rows, self.device)
            self._key = key
        scores = self._batch.process(logits)
        tokens = self._batch.sample(scores)
        shown = self._batch.length_knobs.renormalize
        if shown:
            # renormalize_logits: these rows report logprobs of the processed distribution, as HF's
            # output_scores do with it (banned tokens at float32's lowest instead of -inf, which JSON lacks)
            logits[shown] = scores[shown].clamp(min=torch.finfo(scores.dtype).min)
        return tokens

    def forget(self) -> None:
        """Rows left the batch (a request finished or failed): rebuild at the next pick."""
        self._key, self._batch = (), None
