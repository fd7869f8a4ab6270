"""Counters the worker keeps about its own steps, read by the metrics layer without locks.

Plain integers and floats updated by the worker thread only; readers on the event loop may see a
value one step old, which is fine for monitoring.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from decoding.outputs import FinishReason


@dataclass
class StepStats:
    num_forwards: int = 0
    num_rows_total: int = 0
    num_tokens_total: int = 0
    last_batch_rows: int = 0
    finished: Counter = field(default_factory=Counter)  # finish reason -> requests

    def record_forward(self, num_rows: int, num_tokens: int) -> None:
        self.num_forwards += 1
        self.num_rows_total += num_rows
        self.num_tokens_total += num_tokens
        self.last_batch_rows = num_rows

    def record_finish(self, request: object, reason: FinishReason | None) -> FinishReason:
        """Count a finished request; ``None`` derives the reason from its rows (stop wins)."""
        if reason is None:
            reasons = {row.finish_reason for row in request.rows}
            reason = FinishReason.STOP if FinishReason.STOP in reasons else FinishReason.LENGTH
        self.finished[reason.value] += 1
        return reason
