"""Greedy search and multinomial sampling (HF ``_sample``), ``n`` rows per request.

Each row owns a KV slot and feeds its last token every step; its next token is a ``Pick``, so
every plain row of every request is processed and picked in the engine's one batched pass.
``n > 1`` rows share the request's generator (drawn in row order) and copy the prompt's K/V once.
"""

from __future__ import annotations

import torch

from decoding.model.runner import RowInput
from decoding.state.request import Row
from decoding.strategies.base import DecodingStrategy, Fed, Pick


class PlainDecoding(DecodingStrategy):
    def start(self, last_logits: torch.Tensor, last_chunk: RowInput) -> list[Pick]:
        self.copy_prompt_to_rows()
        next_logits = self.next_logits(last_logits[None], last_chunk)
        return [Pick(self, row, next_logits) for row in self.request.rows]

    def plan(self) -> list[RowInput]:
        return [
            RowInput(row.slot, row.num_cached, [row.output_ids[-1]], 0, hidden_layers=self.hidden_layers)
            for row in self.request.rows
            if not row.finished
        ]

    def consume(self, fed: list[Fed]) -> list[Pick]:
        live = [row for row in self.request.rows if not row.finished]
        picks = [self.consume_row(row, row_input, logits) for row, (row_input, logits) in zip(live, fed, strict=True)]
        return [pick for pick in picks if pick is not None]

    def consume_row(self, row: Row, row_input: RowInput, logits: torch.Tensor) -> Pick | None:
        """One row's share of the forward: its new token's K/V is in, its next token is a pick."""
        row.num_cached += 1
        return Pick(self, row, self.next_logits(logits, row_input))

    def next_logits(self, logits: torch.Tensor, row_input: RowInput) -> torch.Tensor:
        """The ``[vocab_size]`` logits the next token is picked from (``logits``: the row's
        ``[num_kept, vocab_size]``); DoLa replaces them with its layer contrast."""
        return logits[-1]
