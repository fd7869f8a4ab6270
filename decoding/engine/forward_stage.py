"""The step's one forward: every planned row of every request in one call of the runner, and, when that
call raises, one call per request so only the requests that break it fail."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from decoding.model.runner import ModelRunner, RowInput, StepInterrupted
from decoding.state.context import EngineContext
from decoding.strategies import DecodingStrategy

logger = logging.getLogger(__name__)


@dataclass
class Fed:
    """One row of this step's forward: whose it is, what it fed, whether it is a prompt chunk."""

    strategy: DecodingStrategy
    row_input: RowInput
    prompt: bool


class Urgent(Protocol):
    """What a forward asks between layers and calls when it stops (``engine/urgent.py``'s ``UrgentLane``)."""

    def interrupts(self) -> bool: ...

    def serve(self) -> None: ...


def by_request(batch: list[Fed]) -> list[tuple[DecodingStrategy, list[Fed]]]:
    """The batch's rows grouped by request, in first-appearance order."""
    groups: dict[int, tuple[DecodingStrategy, list[Fed]]] = {}
    for fed in batch:
        groups.setdefault(id(fed.strategy), (fed.strategy, []))[1].append(fed)
    return list(groups.values())


def run(runner: ModelRunner, ctx: EngineContext, batch: list[Fed], fail: Callable[[DecodingStrategy, str], None],
        urgent: Urgent | None = None) -> tuple[list[Fed], list[torch.Tensor]]:  # fmt: skip
    """(the rows that ran, their logits); keeps ``ctx.step_seconds``, the unit drafting time is weighed in.

    ``urgent``: the forward stops between layers when a request that outranks every row of the batch
    arrives; the lane serves that request's prompt, then this forward runs again as it was (its rows'
    plans, blocks and lengths untouched), its time counted without the urgent one's."""
    started = time.perf_counter()
    while True:
        try:
            logits = runner.forward([fed.row_input for fed in batch], interrupt=urgent.interrupts if urgent else None)
            break
        except StepInterrupted:
            served = time.perf_counter()
            urgent.serve()
            started += time.perf_counter() - served
        except Exception:
            logger.exception("batched forward failed; retrying request by request")
            return _isolating(runner, batch, fail)
    elapsed = time.perf_counter() - started
    previous = ctx.step_seconds
    ctx.step_seconds = elapsed if previous is None else 0.8 * previous + 0.2 * elapsed
    return batch, logits


def _isolating(runner: ModelRunner, batch: list[Fed],
               fail: Callable[[DecodingStrategy, str], None]) -> tuple[list[Fed], list[torch.Tensor]]:  # fmt: skip
    """Find who broke a batched forward: one forward per request, fail only those that raise.

    Safe to repeat: a failed forward wrote K/V only beyond every row's committed length.
    """
    kept, kept_logits = [], []
    for strategy, mine in by_request(batch):
        try:
            logits = runner.forward([fed.row_input for fed in mine])
        except Exception as exc:
            fail(strategy, f"forward failed: {exc}")
            continue
        kept.extend(mine)
        kept_logits.extend(logits)
    return kept, kept_logits
