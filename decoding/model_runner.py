"""One forward for all rows of all requests.

The runner packs every row's new tokens into a single sequence, hands the model a
``StepLayout`` through transformers' attention kwargs, and asks for logits only at the positions
somebody needs (``logits_to_keep``), so the LM head, the largest matmul of a small model, runs
on a handful of rows instead of every prompt token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decoding.attention import Segment, StepLayout, active_layout
from decoding.kv_cache import KVPool


@dataclass
class RowInput:
    """What one row feeds this step and which of its positions need logits."""

    slot: int
    start: int  # tokens already cached for this row
    token_ids: list[int]
    logits_from: int  # logits are returned for token_ids[logits_from:]; len(token_ids) means none


class ModelRunner:
    def __init__(self, model: torch.nn.Module, pool: KVPool, device: torch.device) -> None:
        self.model = model
        self.pool = pool
        self.device = device

    @torch.inference_mode()
    def forward(self, inputs: list[RowInput]) -> list[torch.Tensor]:
        """Run one forward; returns, per input, float32 logits ``[num_kept, vocab_size]``."""
        # Single-token rows first: StepLayout batches them into one attention call.
        order = sorted(range(len(inputs)), key=lambda i: len(inputs[i].token_ids) != 1)
        segments: list[Segment] = []
        flat_ids: list[int] = []
        keep: list[int] = []
        kept_ranges: dict[int, tuple[int, int]] = {}
        for i in order:
            row = inputs[i]
            offset = len(flat_ids)
            segments.append(Segment(row.slot, row.start, len(row.token_ids)))
            flat_ids.extend(row.token_ids)
            first = len(keep)
            keep.extend(range(offset + row.logits_from, offset + len(row.token_ids)))
            kept_ranges[i] = (first, len(keep))
        layout = StepLayout(self.pool, segments, self.device)
        input_ids = torch.tensor([flat_ids], dtype=torch.long, device=self.device)  # [1, num_tokens]
        if not keep:
            keep_index = torch.tensor([len(flat_ids) - 1], device=self.device)
        else:
            keep_index = torch.tensor(keep, dtype=torch.long, device=self.device)
        with active_layout(layout):
            out = self.model(
                input_ids=input_ids,
                position_ids=layout.token_positions.unsqueeze(0),
                use_cache=False,
                logits_to_keep=keep_index,
            )
        logits = out.logits[0].float()  # [num_kept, vocab_size]
        return [logits[kept_ranges[i][0] : kept_ranges[i][1]] for i in range(len(inputs))]
