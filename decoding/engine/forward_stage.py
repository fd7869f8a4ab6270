"""The step's one forward: every planned row of every request in one call of the runner, and, when that
call raises, one call per request so only the requests that break it fail."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from decoding.model.runner import ModelRunner, RowInput
from decoding.state.context import EngineContext
from decoding.strategies import DecodingStrategy

logger = logging.getLogger(__name__)


@dataclass
class Fed:
    """One row of this step's forward: whose it is, what it fed, whether it is a prompt chunk."""

    strategy: DecodingStrategy
    row_input: RowInput
    prompt: bool


def by_request(batch: list[Fed]) -> list[tuple[DecodingStrategy, list[Fed]]]:
    """The batch's rows grouped by request, in first-appearance order."""
    groups: dict[int, tuple[DecodingStrategy, list[Fed]]] = {}
    for fed in batch:
        groups.setdefault(id(fed.strategy), (fed.strategy, []))[1].append(fed)
    return list(groups.values())


def run(runner: ModelRunner, ctx: EngineContext, batch: list[Fed],
        fail: Callable[[DecodingStrategy, str], None]) -> tuple[list[Fed], list[torch.Tensor]]:  # fmt: skip
    """(the rows that ran, their logits); keeps ``ctx.step_seconds``, the unit drafting time is weighed in."""
    started = time.perf_counter()
    try:
        logits = runner.forward([fed.row_input for fed in batch])
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
