"""The engine step: expire, admit, draft, plan, one forward, consume, sample, stream.

The engine is synchronous and single-threaded: the worker thread owns it and calls ``step()`` in
a loop. It asks every running request's strategy the same questions (``strategies/base.py``) and
never which strategy it is; everything a request needs between steps lives in its ``Request`` and
its strategy. Outputs leave through ``emit`` as ``RequestOutput``s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from decoding import picking, prefill
from decoding.custom_job import CustomJobs
from decoding.custom_loading import LoadedMethod
from decoding.detokenizer import token_text
from decoding.kv_cache import DEFAULT_BLOCK_SIZE, KVPool, OutOfBlocksError
from decoding.model_runner import ModelRunner, RowInput
from decoding.outputs import RequestOutput
from decoding.params import MAX_CONTRASTIVE_TOP_K, GenerationParams
from decoding.request import Request
from decoding.sampling import BatchSampler
from decoding.scheduler import Scheduler
from decoding.strategies import EngineContext, Pick, make_strategy
from decoding.strategies.drafting import Drafter, make_assistant
from decoding.telemetry import EngineObserver

logger = logging.getLogger(__name__)


@dataclass
class EngineLimits:
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    request_timeout: float | None = None
    kv_cache_bytes: int | None = None  # the KV pool's size; None: every row at full length
    kv_cache_blocks: int | None = None  # or its size in blocks (tests and benchmarks)
    block_size: int = DEFAULT_BLOCK_SIZE
    prefix_caching: bool = True


@dataclass
class _Fed:
    """One row of this step's forward: whose it is, what it fed, whether it is a prompt chunk."""

    request: Request
    row_input: RowInput
    prompt: bool


class Engine:
    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: object,
        eos_token_ids: list[int],
        limits: EngineLimits,
        emit: Callable[[RequestOutput], None],
        device: torch.device,
        observer: EngineObserver | None = None,
        assistants: dict[str, object] | None = None,
        custom_methods: dict[str, LoadedMethod] | None = None,
    ) -> None:
        """``assistants``: name -> a model sharing the target's tokenizer, or a
        ``(model, tokenizer, eos ids)`` tuple for one that drafts through text."""
        scratch = MAX_CONTRASTIVE_TOP_K  # contrastive candidates' scratch positions after a row
        self.pool = KVPool.for_model(
            model, num_slots=limits.max_num_seqs, max_model_len=limits.max_model_len + scratch, device=device,
            memory_bytes=limits.kv_cache_bytes, num_blocks=limits.kv_cache_blocks, block_size=limits.block_size,
            prefix_caching=limits.prefix_caching,
        )  # fmt: skip
        longest = self.pool.blocks_for(limits.max_model_len + scratch)
        if self.pool.blocks.num_blocks < longest:
            raise ValueError(
                f"--kv-cache-memory holds {self.pool.blocks.num_blocks * self.pool.block_size} tokens, fewer than "
                f"one request of --max-model-len {limits.max_model_len} needs; raise it or lower --max-model-len"
            )
        self.runner = ModelRunner(model, self.pool, device)
        drafters = {}
        for name, assistant in (assistants or {}).items():
            model_, tokenizer_, eos_ = assistant if isinstance(assistant, tuple) else (assistant, None, None)
            drafters[name] = make_assistant(
                name, model_, limits.max_num_seqs, 2 * limits.max_model_len + scratch, device, tokenizer_, eos_,
                num_blocks=2 * self.pool.blocks.num_blocks,
            )  # fmt: skip
        self.drafter = Drafter(self.runner, drafters, set(eos_token_ids), tokenizer)
        self.scheduler = Scheduler(self.pool, limits.max_num_batched_tokens, observer)
        self.sampler = BatchSampler(device)
        self.tokenizer = tokenizer
        self.ctx = EngineContext.for_model(
            model, self.pool, eos_token_ids, limits.max_model_len, self._token_text, observer or EngineObserver()
        )
        self.limits = limits
        self.emit = emit
        self.requests: dict[str, Request] = {}
        # custom_generate requests: exclusive jobs run between steps (decoding/custom_job.py)
        self.custom = CustomJobs(model, tokenizer, eos_token_ids, device, lambda out: self.emit(out),
                                 lambda: self.observer, limits.request_timeout, custom_methods)  # fmt: skip

    @property
    def observer(self) -> EngineObserver:
        return self.ctx.observer

    # ---- requests in and out ---------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_ids: list[int], params: GenerationParams) -> None:
        if params.custom_generate is not None:
            self.custom.add(request_id, prompt_ids, params)
            return
        request = Request.create(request_id, prompt_ids, params, self.tokenizer, self.ctx, self.limits.request_timeout)
        request.strategy = make_strategy(request, self.ctx)
        self.requests[request_id] = request
        self.scheduler.add(request)

    def abort(self, request_id: str) -> None:
        """The client went away: free the request now; nobody reads its end."""
        request = self.requests.get(request_id)
        if request is not None:
            self._retire(request, error=None, code="internal")
        self.custom.abort(request_id)  # a queued custom job, and the flag Worker.abort raised

    def fail_all(self, message: str, code: str = "internal") -> None:
        """End every request with an error (``code`` "unavailable": the server is stopping)."""
        for request in list(self.requests.values()):
            self._fail(request, message, code)
        self.custom.fail_all(message, code)

    def has_work(self) -> bool:
        return self.scheduler.has_work() or self.custom.has_work()

    # ---- the step ------------------------------------------------------------------------------
    def step(self) -> None:
        self.custom.run_next()  # an exclusive custom_generate job, if one waits; the batch resumes after it
        now = time.monotonic()
        self._expire(now)
        for request in self.scheduler.admit():
            request.start_time = now
            self.observer.on_admitted(request.strategy.name, now - request.arrival_time, len(request.prompt_ids))
        self._draft()
        batch = self._make_room(self._plan())
        if batch:
            batch, logits = self._forward(batch)
            self._sample(self._consume(batch, logits))
            self._report({id(fed.request): fed.request for fed in batch}.values())
        # after finished requests left, so the gauges never show a stale batch
        self.observer.on_step(len(batch), self.scheduler.num_running, self.scheduler.num_waiting, self.pool.usage)

    def _expire(self, now: float) -> None:
        """Requests past a time limit end as HF's ``MaxTimeCriteria`` ends them: with what they have."""
        expired = [request for request in self.requests.values() if request.expired(now)]
        for request in expired:
            request.strategy.finish_now()
        self._report(expired)

    def _draft(self) -> None:
        """The drafting stage: speculative rows get their drafts before the target's forward."""
        jobs = [job for request in self._prefilled() for job in request.strategy.draft_jobs()]
        if not jobs:
            return
        try:
            self.drafter.draft(jobs)
        except Exception as exc:  # drafting is an optimisation: without drafts every row still decodes
            if isinstance(exc, OutOfBlocksError):  # the planned rows get their blocks first
                logger.debug("no KV blocks for drafts; this step runs without drafts")
            else:
                logger.exception("drafting failed; this step runs without drafts")
            for job in jobs:
                job.spec.drafts = []

    def _plan(self) -> list[_Fed]:
        batch = [_Fed(r, row_input, False) for r in self._prefilled() for row_input in r.strategy.plan()]
        budget = self.scheduler.prefill_budget(sum(len(fed.row_input.token_ids) for fed in batch))
        for request in self.scheduler.running:
            if request.prefill_done or budget <= 0:
                continue
            chunk = prefill.next_chunk(request, budget)
            batch.append(_Fed(request, chunk, True))
            budget -= len(chunk.token_ids)
        return batch

    def _make_room(self, batch: list[_Fed]) -> list[_Fed]:
        """Every row of the step gets the blocks it writes; preempted requests leave the step."""
        while (too_big := self.scheduler.make_room([(f.request, f.row_input) for f in batch])) is not None:
            self._fail(too_big, f"the KV cache ({self.pool.blocks.num_blocks} blocks) cannot hold this request; "
                                "raise --kv-cache-memory")  # fmt: skip
        running = {id(request) for request in self.scheduler.running}
        return [fed for fed in batch if id(fed.request) in running]

    def _forward(self, batch: list[_Fed]) -> tuple[list[_Fed], list[torch.Tensor]]:
        started = time.perf_counter()
        try:
            logits = self.runner.forward([fed.row_input for fed in batch])
        except Exception:
            logger.exception("batched forward failed; retrying request by request")
            return self._forward_isolating(batch)
        elapsed = time.perf_counter() - started  # a step's cost, the unit drafting time is weighed in
        previous = self.ctx.step_seconds
        self.ctx.step_seconds = elapsed if previous is None else 0.8 * previous + 0.2 * elapsed
        return batch, logits

    def _forward_isolating(self, batch: list[_Fed]) -> tuple[list[_Fed], list[torch.Tensor]]:
        """Find who broke a batched forward: one forward per request, fail only those that raise.

        Safe to repeat: a failed forward wrote K/V only beyond every row's committed length.
        """
        kept, kept_logits = [], []
        for request, mine in _by_request(batch):
            try:
                logits = self.runner.forward([fed.row_input for fed in mine])
            except Exception as exc:
                self._fail(request, f"forward failed: {exc}")
                continue
            kept.extend(mine)
            kept_logits.extend(logits)
        return kept, kept_logits

    def _consume(self, batch: list[_Fed], all_logits: list[torch.Tensor]) -> list[Pick]:
        logits_of = {id(fed): logits for fed, logits in zip(batch, all_logits, strict=True)}
        picks: list[Pick] = []
        for request, mine in _by_request(batch):
            try:
                decode = [(fed.row_input, logits_of[id(fed)]) for fed in mine if not fed.prompt]
                if decode:
                    picks.extend(request.strategy.consume(decode))
                for chunk in (fed for fed in mine if fed.prompt):
                    logits = logits_of[id(chunk)]
                    picks.extend(prefill.consume_chunk(request, chunk.row_input, logits, self._token_text))
            except Exception as exc:
                logger.exception("request %s failed", request.request_id)
                self._fail(request, str(exc))
        return [pick for pick in picks if pick.strategy.request.error is None]

    def _sample(self, picks: list[Pick]) -> None:
        """Pick every plain row's next token in one batched pass, then hand each to its strategy."""
        picking.sample(self.sampler, picks, self._fail)

    # ---- streaming and the end -----------------------------------------------------------------------
    def _report(self, requests: Iterable[Request]) -> None:
        for request in requests:
            if request.request_id not in self.requests:
                continue
            output = request.take_output()
            if request.strategy.finished:
                output.finished = True
                self._forget(request)
                reason = request.overall_finish_reason().value
                self.observer.on_finished(request.strategy.name, reason, time.monotonic() - request.arrival_time)
            if output.deltas or output.finished or output.prompt_logprobs:
                self.emit(output)

    def _fail(self, request: Request, message: str, code: str = "internal") -> None:
        request.error = f"request {request.request_id} failed: {message}"
        self._retire(request, request.error, code)

    def _retire(self, request: Request, error: str | None, code: str) -> None:
        """End a request that did not finish by itself (aborted or failed)."""
        if request.request_id not in self.requests:
            return
        self._forget(request)
        self.emit(
            RequestOutput(
                request.request_id,
                num_prompt_tokens=len(request.prompt_ids),
                num_generated_tokens=request.num_generated,
                finished=True,
                error=error,
                error_code=code,
            )
        )
        reason = "abort" if error is None else "error"
        self.observer.on_finished(request.strategy.name, reason, time.monotonic() - request.arrival_time)
        # no step may follow (the engine goes idle): the gauges must not keep the freed rows
        self.observer.on_step(0, self.scheduler.num_running, self.scheduler.num_waiting, self.pool.usage)

    def _forget(self, request: Request) -> None:
        self.scheduler.remove(request)
        request.strategy.release()
        self.requests.pop(request.request_id, None)
        self.sampler.forget()

    def _prefilled(self) -> list[Request]:
        return [request for request in self.scheduler.running if request.prefill_done]

    def _token_text(self, token_id: int) -> str:
        return token_text(self.tokenizer, token_id)


def _by_request(batch: list[_Fed]) -> list[tuple[Request, list[_Fed]]]:
    """The batch's rows grouped by request, in first-appearance order."""
    groups: dict[int, tuple[Request, list[_Fed]]] = {}
    for fed in batch:
        groups.setdefault(id(fed.request), (fed.request, []))[1].append(fed)
    return list(groups.values())
