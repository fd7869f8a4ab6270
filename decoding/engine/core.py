"""The engine step: expire, admit, draft, plan, one forward, consume, sample, stream.

The engine is synchronous and single-threaded: the worker thread owns it and calls ``step()`` in
a loop. It asks every running request's strategy the same questions (``strategies/base.py``) and
never which strategy it is; everything a request needs between steps lives in its ``Request`` and
its strategy. Outputs leave through ``emit`` as ``RequestOutput``s.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator

import torch

from decoding.custom.jobs import CustomJobs
from decoding.custom.loading import LoadedMethod
from decoding.engine import forward_stage, prefill, sample_stage, urgent, vision_stage
from decoding.engine.drafting import Drafter
from decoding.engine.encoder_stage import EncoderStage
from decoding.engine.forward_stage import Fed, by_request
from decoding.engine.limits import EngineLimits, assistant_drafters, kv_pool_for
from decoding.engine.lora import EngineLoras, LoraLimits, check_adapter
from decoding.engine.scheduler import Scheduler
from decoding.kv.pool import OutOfBlocksError
from decoding.model.runner import ModelRunner
from decoding.model.seq2seq import EncoderInput, is_encoder_decoder
from decoding.outputs import RequestOutput
from decoding.params import GenerationParams
from decoding.sampling import BatchSampler
from decoding.sampling.grammar import GrammarFailure
from decoding.state.context import EngineContext
from decoding.state.request import Request
from decoding.strategies import DecodingStrategy, Pick, make_strategy
from decoding.telemetry import EngineObserver
from decoding.text.detokenizer import token_text
from decoding.vision.prompt import ImagePrompt

logger = logging.getLogger(__name__)


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
        lora: LoraLimits | None = None,
    ) -> None:
        """``assistants``: name -> a model sharing the target's tokenizer, or a
        ``(model, tokenizer, eos ids)`` tuple for one that drafts through text; ``lora``: serve adapters."""
        self.pool = kv_pool_for(model, limits, device)
        self.loras = EngineLoras(model, self.pool, lora) if lora is not None else None
        residency = self.loras.residency if self.loras is not None else None
        self.runner = ModelRunner(model, self.pool, device, residency)
        self.encoder = EncoderStage(model, self.pool, device) if is_encoder_decoder(model.config) else None
        self.drafter = Drafter(self.runner, assistant_drafters(assistants or {}, limits, self.pool, device),
                               set(eos_token_ids), tokenizer)  # fmt: skip
        observer = observer or EngineObserver()  # one observer, shared by the scheduler and the strategies
        self.scheduler = Scheduler(self.pool, limits.max_num_batched_tokens, observer, residency,
                                   max_rows=limits.max_num_seqs, weights=limits.caller_weights,
                                   prefill_share=limits.max_prefill_share, fair_share=limits.fair_share)  # fmt: skip
        self.sampler = BatchSampler(device)
        # requests that outrank a step under way do not wait for it (urgent.py); an encoder's steps are never cut
        self.urgent = urgent.UrgentLane(self.scheduler, self._prompts_alone, lambda: self.observer,
                                        allowed=self.encoder is None)
        self.tokenizer = tokenizer
        self.ctx = EngineContext.for_model(
            model, self.pool, eos_token_ids, limits.max_model_len, self._token_text, observer
        )
        self.limits = limits
        self.emit = emit
        self.strategies: dict[str, DecodingStrategy] = {}  # request id -> its running strategy
        # custom_generate requests: exclusive jobs run between steps (decoding/custom/jobs.py)
        self.custom = CustomJobs(model, tokenizer, eos_token_ids, device, lambda out: self.emit(out),
                                 lambda: self.observer, limits.request_timeout, custom_methods)  # fmt: skip

    @property
    def observer(self) -> EngineObserver:
        return self.ctx.observer

    @observer.setter
    def observer(self, observer: EngineObserver) -> None:
        self.ctx.observer = self.scheduler.observer = observer

    @contextlib.contextmanager
    def muted(self) -> Iterator[None]:
        """Metrics see nothing of what runs inside (the compile warm-up's requests)."""
        saved = self.observer
        self.observer = EngineObserver()
        try:
            yield
        finally:
            self.observer = saved

    @property
    def requests(self) -> dict[str, Request]:
        """Every request the engine holds, by id."""
        return {request_id: strategy.request for request_id, strategy in self.strategies.items()}

    # ---- requests in and out ---------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_ids: list[int], params: GenerationParams,
                    encoder_input: EncoderInput | None = None,
                    image_prompt: ImagePrompt | None = None) -> None:  # fmt: skip
        """``encoder_input``: an encoder-decoder model's encoder input (Whisper's features), with
        ``prompt_ids`` its decoder's prompt (``EncoderStage.inputs``); ``image_prompt``: the prompt's images."""
        if params.custom_generate is not None:
            self.custom.add(request_id, prompt_ids, params)
            return
        check_adapter(self.loras, params)
        if self.encoder is not None:
            prompt_ids, encoder_input = self.encoder.inputs(prompt_ids, encoder_input)
        request = Request.create(request_id, prompt_ids, params, self.tokenizer, self.ctx, self.limits.request_timeout,
                                 image_prompt.text_start if image_prompt is not None else 0)  # fmt: skip
        if self.encoder is not None:
            self.encoder.attach(request, encoder_input)
        request.image_prompt = image_prompt
        self.urgent.see(params.priority)
        strategy = make_strategy(request, self.ctx)
        self.strategies[request_id] = strategy
        self.scheduler.add(strategy)

    def abort(self, request_id: str) -> None:
        """The client went away: free the request now; nobody reads its end."""
        strategy = self.strategies.get(request_id)
        if strategy is not None:
            self._retire(strategy, error=None, code="internal")
        self.custom.abort(request_id)  # a queued custom job, and the flag Worker.abort raised

    def fail_all(self, message: str, code: str = "internal") -> None:
        """End every request with an error (``code`` "unavailable": the server is stopping)."""
        for strategy in list(self.strategies.values()):
            self._fail(strategy, message, code)
        self.custom.fail_all(message, code)

    def has_work(self) -> bool:
        return self.scheduler.has_work() or self.custom.has_work()

    # ---- the step ------------------------------------------------------------------------------
    def step(self) -> bool:
        """One step; False when it changed nothing (the worker then waits for a command or a deadline)."""
        ran_custom = self.custom.run_next()  # an exclusive custom_generate job; the batch resumes after it
        now = time.monotonic()
        num_requests = len(self.strategies)
        self._expire(now)
        admitted, unfit = self.scheduler.admit()
        for strategy, why in unfit:
            self._fail(strategy, why)
        for strategy in admitted:
            request = strategy.request
            request.start_time = now
            self.observer.on_admitted(strategy.name, now - request.arrival_time, len(request.prompt_ids))
        if self.encoder is not None:  # before the decoder's first forward reads the cross slots
            self.encoder.run([s.request for s in admitted if not s.request.encoded],
                             lambda request, why: self._fail(self.strategies[request.request_id], why))  # fmt: skip
        self._draft()
        started = time.perf_counter()
        batch = vision_stage.feed(self.runner.model, self._make_room(self._plan()), self._fail, self.observer)
        vision_seconds = time.perf_counter() - started  # (nothing but the tower runs in the feed)
        if batch:
            share = self.scheduler.prefill_share
            if not share.unlimited:  # (--max-prefill-share: what this step spends on prompts, booked after it)
                prompt_tokens = sum(len(fed.row_input.token_ids) for fed in batch if fed.prompt)
                decode_tokens = sum(len(fed.row_input.token_ids) for fed in batch if not fed.prompt)
            batch, logits = self._forward(batch, self.urgent.arm(batch))
            # every plain row's next token in one batched pass, then handed to its strategy
            sample_stage.sample(self.sampler, self._consume(batch, logits), self._fail)
            self._report({id(fed.strategy): fed.strategy for fed in batch}.values())
            if not share.unlimited:
                share.record(time.perf_counter() - started, prompt_tokens, decode_tokens, vision_seconds)
        # after finished requests left, so the gauges never show a stale batch
        self.observer.on_step(len(batch), self.scheduler.num_running, self.scheduler.num_waiting, self.pool.usage)
        return bool(ran_custom or batch or admitted or len(self.strategies) != num_requests)

    def _expire(self, now: float) -> None:
        """Requests past a time limit end as HF's ``MaxTimeCriteria`` ends them: with what they have."""
        expired = [strategy for strategy in self.strategies.values() if strategy.request.expired(now)]
        for strategy in expired:
            strategy.finish_now()
        self._report(expired)

    def _draft(self) -> None:
        """The drafting stage: speculative rows get their drafts before the target's forward."""
        jobs = [job for strategy in self._prefilled() for job in strategy.draft_jobs()]
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

    def _plan(self) -> list[Fed]:
        batch = [Fed(s, row_input, False) for s in self._prefilled() for row_input in s.plan()]
        decode_tokens = sum(len(fed.row_input.token_ids) for fed in batch)
        budget = self.scheduler.prefill_budget(decode_tokens)
        before_images = self.scheduler.holds_back_images(decode_tokens)  # prompt work over --max-prefill-share
        one_tower_call = self.scheduler.prefill_share.one_tower_call_a_step(decode_tokens)
        for strategy in self.scheduler.stepping():
            if strategy.request.prefill_done or budget <= 0:
                continue
            chunk = prefill.next_chunk(strategy, budget, before_images)
            if not chunk.token_ids:  # its next token is an image's, held back this step
                continue
            batch.append(Fed(strategy, chunk, True))
            budget -= len(chunk.token_ids)
            if one_tower_call and prefill.runs_vision_tower(strategy, chunk):
                before_images = True  # later images wait until the credit this one leaves allows them
        return batch

    def _make_room(self, batch: list[Fed]) -> list[Fed]:
        """Every row of the step gets the blocks it writes; preempted requests leave the step."""
        while (too_big := self.scheduler.make_room([(f.strategy, f.row_input) for f in batch])) is not None:
            self._fail(*too_big)
        running = {id(strategy) for strategy in self.scheduler.running}
        return [fed for fed in batch if id(fed.strategy) in running]

    def _forward(self, batch: list[Fed], lane: urgent.UrgentLane | None = None) -> tuple[list[Fed], list[torch.Tensor]]:
        return forward_stage.run(self.runner, self.ctx, batch, self._fail, lane)

    def _prompts_alone(self, strategies: list[DecodingStrategy]) -> None:
        """The urgent lane's forwards, inside an interrupted step: these requests' prompts, to their first token."""
        while batch := vision_stage.feed(self.runner.model, urgent.prompt_chunks(strategies, self.scheduler),
                                         self._fail, self.observer):  # fmt: skip
            batch, logits = self._forward(batch)
            sample_stage.sample(self.sampler, self._consume(batch, logits), self._fail)
            self._report(strategies)

    def _consume(self, batch: list[Fed], all_logits: list[torch.Tensor]) -> list[Pick]:
        logits_of = {id(fed): logits for fed, logits in zip(batch, all_logits, strict=True)}
        picks: list[Pick] = []
        for strategy, mine in by_request(batch):
            try:
                decode = [(fed.row_input, logits_of[id(fed)]) for fed in mine if not fed.prompt]
                if decode:
                    picks.extend(strategy.consume(decode))
                for chunk in (fed for fed in mine if fed.prompt):
                    logits = logits_of[id(chunk)]
                    picks.extend(prefill.consume_chunk(strategy, chunk.row_input, logits, self._token_text))
            except Exception as exc:  # a constraint that cannot go on is the request's, not a bug: no traceback
                if sample_stage.error_code(exc) == "internal":  # a request's own error (a 400) is not a bug
                    logger.exception("request %s failed", strategy.request.request_id)
                self._fail(strategy, str(exc), sample_stage.error_code(exc), cause=exc)
        return [pick for pick in picks if pick.strategy.request.error is None]

    # ---- streaming and the end -----------------------------------------------------------------------
    def _report(self, strategies: Iterable[DecodingStrategy]) -> None:
        for strategy in strategies:
            request = strategy.request
            if request.request_id not in self.strategies:
                continue
            output = request.take_output()
            if strategy.finished:
                output.finished = True
                self._forget(strategy)
                reason = request.overall_finish_reason().value
                self.observer.on_finished(strategy.name, reason, time.monotonic() - request.arrival_time)
            if output.deltas or output.finished or output.prompt_logprobs:
                self.emit(output)

    def _fail(self, strategy: DecodingStrategy, message: str, code: str = "internal", cause: object = None) -> None:
        request = strategy.request
        if isinstance(cause, GrammarFailure):  # logged and counted: a client's 400, not a server's bug
            logger.warning("request %s: its constraint failed (%s): %s", request.request_id, cause.reason, cause)
            self.observer.on_grammar_failed(cause.reason)
        request.error = f"request {request.request_id} failed: {message}"
        self._retire(strategy, request.error, code)

    def _retire(self, strategy: DecodingStrategy, error: str | None, code: str) -> None:
        """End a request that did not finish by itself (aborted or failed)."""
        request = strategy.request
        if request.request_id not in self.strategies:
            return
        self._forget(strategy)
        self.emit(RequestOutput(request.request_id, num_prompt_tokens=request.num_input_tokens, finished=True,
                                num_generated_tokens=request.num_generated, error=error, error_code=code))  # fmt: skip
        reason = "abort" if error is None else "error"
        self.observer.on_finished(strategy.name, reason, time.monotonic() - request.arrival_time)
        # no step may follow (the engine goes idle): the gauges must not keep the freed rows
        self.observer.on_step(0, self.scheduler.num_running, self.scheduler.num_waiting, self.pool.usage)

    def _forget(self, strategy: DecodingStrategy) -> None:
        self.scheduler.remove(strategy)
        strategy.release()
        self.strategies.pop(strategy.request.request_id, None)
        self.sampler.forget()

    def _prefilled(self) -> list[DecodingStrategy]:
        return [strategy for strategy in self.scheduler.stepping() if strategy.request.prefill_done]

    def _token_text(self, token_id: int) -> str:
        return token_text(self.tokenizer, token_id)
