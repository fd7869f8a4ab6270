"""The engine's last stage: every plain row's next token picked in one batched pass, then handed
to its strategy; a pass that fails is retried request by request, so the request whose knobs
broke it fails alone and the others keep their tokens. Rows no token can be picked from (NaN or
all -inf scores: ``sampling.finite``) are named before anything is drawn: their requests fail
with a 400 and the rest are picked again at once, to the tokens they would have had. A
constraint that cannot go on (``GrammarFailure``: its matcher errored, or its masks are over their
time budget) names its request, which fails at once; the others are picked again without it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from decoding.sampling import BatchSampler
from decoding.sampling.finite import NonFiniteScores
from decoding.sampling.grammar import GrammarFailure
from decoding.state.request import Request
from decoding.strategies import Pick

logger = logging.getLogger(__name__)
Fail = Callable[..., None]  # Engine._fail(strategy, message, code=...)


def sample(sampler: BatchSampler, picks: list[Pick], fail: Fail) -> None:
    if not picks:
        return
    logits = torch.stack([pick.logits for pick in picks])  # [num_picks, vocab_size]
    try:
        tokens = sampler.pick([pick.row.sampling for pick in picks], logits)
    except NonFiniteScores as exc:  # raised before any draw: the other rows are picked again, to the same tokens
        sampler.forget()
        failing = {id(picks[row].strategy) for row in exc.rows}
        for strategy in {id(pick.strategy): pick.strategy for pick in picks if id(pick.strategy) in failing}.values():
            logger.warning("request %s failed while sampling: %s", strategy.request.request_id, exc)
            fail(strategy, str(exc), code=error_code(exc), cause=exc)
        sample(sampler, [pick for pick in picks if id(pick.strategy) not in failing], fail)
        return
    except GrammarFailure as exc:
        sampler.forget()
        failing = [pick for pick in picks if _budget_of(pick) is exc.budget]
        if failing:
            fail(failing[0].strategy, str(exc), code=error_code(exc), cause=exc)
            sample(sampler, [pick for pick in picks if _budget_of(pick) is not exc.budget], fail)
        else:
            _sample_each_request(sampler, picks, fail)
        return
    except Exception:
        logger.exception("batched sampling failed; retrying request by request")
        sampler.forget()
        _sample_each_request(sampler, picks, fail)
        return
    _accept(picks, tokens, logits, fail)


def _sample_each_request(sampler: BatchSampler, picks: list[Pick], fail: Fail) -> None:
    """Each request's rows alone; sampled directly, never retried again (no recursion)."""
    by_request: dict[int, list[Pick]] = {}
    for pick in picks:
        by_request.setdefault(id(pick.strategy), []).append(pick)
    for mine in by_request.values():
        logits = torch.stack([pick.logits for pick in mine])
        try:
            tokens = sampler.pick([pick.row.sampling for pick in mine], logits)
        except Exception as exc:
            request: Request = mine[0].strategy.request
            logger.warning("request %s failed while sampling: %s", request.request_id, exc)
            fail(mine[0].strategy, f"sampling failed: {exc}", code=error_code(exc), cause=exc)
            continue
        finally:
            sampler.forget()
        _accept(mine, tokens, logits, fail)


def error_code(exc: Exception) -> str:
    """``invalid_request`` (a 400) when the request's own knobs or constraint broke it, else ``internal``."""
    return "invalid_request" if isinstance(exc, (NonFiniteScores, GrammarFailure)) else "internal"


def _budget_of(pick: Pick) -> object | None:
    grammar = pick.row.sampling.grammar
    return None if grammar is None else grammar.budget


def _accept(picks: list[Pick], tokens: list[int], logits: torch.Tensor, fail: Fail) -> None:
    now = time.monotonic()
    for pick, token, row_logits in zip(picks, tokens, logits, strict=True):
        request = pick.strategy.request
        if request.error is not None:
            continue
        try:
            pick.strategy.accept(pick.row, token, row_logits, now)
        except Exception as exc:  # e.g. a detokenizer failure: this request alone fails
            logger.exception("request %s failed", request.request_id)
            fail(pick.strategy, str(exc))
