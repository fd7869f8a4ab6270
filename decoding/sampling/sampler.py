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
        """``logits``: ``[len(rows), vocab_size]`` raw; returns one token per row."""
        key = tuple(id(row) for row in rows)
        if key != self._key or self._batch is None:
            self._batch = SamplingBatch(rows, self.device)
            self._key = key
        return self._batch.sample(self._batch.process(logits))

    def forget(self) -> None:
        """Rows left the batch (a request finished or failed): rebuild at the next pick."""
        self._key, self._batch = (), None
