"""The engine step: admit, plan every row's tokens, one forward, sample, stop, stream.

The engine is synchronous and single-threaded: the worker thread owns it and calls ``step()`` in
a loop. Everything a request needs between steps lives in its ``Request``; the engine only wires
scheduler, runner, sampler and streamers together and reports ``RequestOutput``s through ``emit``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from decoding.detokenizer import token_text
from decoding.kv_cache import KVPool
from decoding.model_runner import ModelRunner, RowInput
from decoding.outputs import FinishReason, RequestOutput, TokenLogprob
from decoding.params import GenerationParams, Strategy
from decoding.request import Request, Row
from decoding.sampling import RowSamplingState, SamplingBatch, make_generator
from decoding.scheduler import Scheduler
from decoding.stats import StepStats
from decoding.strategies.beam_rows import advance_beams, finish_beams, make_beam_search, plan_beam_rows
from decoding.strategies.contrastive import MAX_CONTRASTIVE_TOP_K, ContrastiveSearch
from decoding.strategies.dola import dola_candidate_layers, dola_contrast
from decoding.strategies.drafting import Drafter, make_assistant
from decoding.strategies.speculative import speculation_for, verify_drafts
from decoding.streamer import DeltaStreamer
from decoding.telemetry import EngineObserver
from decoding.token_logprobs import prompt_logprob_entries, token_logprob

logger = logging.getLogger(__name__)


@dataclass
class EngineLimits:
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    request_timeout: float | None = None


@dataclass
class _Work:
    request: Request
    row: Row | None  # None: a prompt chunk (written into the prefill slot) or a beam row
    num_tokens: int
    beam: int | None = None  # the beam this decode row runs, for beam requests


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
    ) -> None:
        config = model.config.get_text_config()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.pool = KVPool(
            num_layers=config.num_hidden_layers,
            num_slots=limits.max_num_seqs,
            num_kv_heads=config.num_key_value_heads,
            head_dim=head_dim,
            max_model_len=limits.max_model_len + MAX_CONTRASTIVE_TOP_K,  # + contrastive candidates' scratch
            dtype=next(model.parameters()).dtype,
            device=device,
        )
        self.runner = ModelRunner(model, self.pool, device)
        spare = MAX_CONTRASTIVE_TOP_K
        drafters = {}
        for name, assistant in (assistants or {}).items():
            # a model shares the target's tokenizer; (model, tokenizer, eos ids) drafts through text
            model_, tokenizer_, eos_ = assistant if isinstance(assistant, tuple) else (assistant, None, None)
            drafters[name] = make_assistant(
                name, model_, limits.max_num_seqs, 2 * limits.max_model_len + spare, device, tokenizer_, eos_
            )
        self.drafter = Drafter(self.runner, drafters, set(eos_token_ids), tokenizer)
        self.scheduler = Scheduler(self.pool, limits.max_num_batched_tokens)
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.eos_token_list = list(eos_token_ids)  # in the model's order: HF pads with the first
        pad = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
        if isinstance(pad, list):
            pad = pad[0] if pad else None
        self.pad_token_id = pad if pad is not None else (self.eos_token_list[0] if self.eos_token_list else 0)
        self.vocab_size = config.vocab_size
        self.num_layers = config.num_hidden_layers
        self.tied_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = model.get_output_embeddings()
        self.limits = limits
        self.emit = emit
        self.device = device
        self.requests: dict[str, Request] = {}
        self.stats = StepStats()
        self.observer = observer or EngineObserver()
        self._sampling_key: tuple[int, ...] = ()
        self._step_seconds: float | None = None
        self._sampling_batch: SamplingBatch | None = None

    # ---- requests in and out ---------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_ids: list[int], params: GenerationParams) -> None:
        generator = make_generator(params.seed, self.device) if params.do_sample else None
        beam_search = params.num_beams > 1
        rows = []
        for index in range(params.n):
            sampling = None
            if not beam_search:
                sampling = RowSamplingState(params, prompt_ids, list(self.eos_token_ids), self.vocab_size, generator)
            streamer = DeltaStreamer(
                self.tokenizer, prompt_ids, stop=params.stop, skip_special_tokens=params.skip_special_tokens
            )
            rows.append(Row(index=index, sampling=sampling, streamer=streamer))
        request = Request(request_id, list(prompt_ids), params, rows, generator=generator)
        if params.strategy is Strategy.CONTRASTIVE:
            for row in rows:
                row.contrastive = ContrastiveSearch(params.penalty_alpha, params.top_k)
        if params.dola_layers is not None:
            request.dola_layers = dola_candidate_layers(params.dola_layers, self.num_layers, self.tied_embeddings)
        if params.strategy is Strategy.ASSISTED:
            for row in rows:
                row.speculation = speculation_for(params)
        if beam_search:
            request.beam = make_beam_search(
                request,
                self.eos_token_list,
                self.pad_token_id,
                self.vocab_size,
                self.limits.max_model_len,
                generator,
                lambda ids: self.tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens),
                self._token_text,
            )
        if self.limits.request_timeout is not None:
            request.deadline = request.arrival_time + self.limits.request_timeout
        self.requests[request_id] = request
        self.scheduler.add(request)

    def abort(self, request_id: str) -> None:
        request = self.requests.get(request_id)
        if request is not None:
            self._finish_request(request, FinishReason.ABORT)

    def fail_all(self, message: str) -> None:
        for request in list(self.requests.values()):
            self._fail(request, message)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    # ---- the step ------------------------------------------------------------------------------
    def step(self) -> None:
        self._expire(time.monotonic())
        for request in self.scheduler.admit():
            request.start_time = time.monotonic()
            self.observer.on_admitted(
                request.params.strategy.value,
                request.start_time - request.arrival_time,
                len(request.prompt_ids),
            )
        work, inputs = self._plan()
        if not inputs:
            return
        started = time.perf_counter()
        try:
            all_logits = self.runner.forward(inputs)
            # a decode step's cost, the unit speculation weighs its drafting time in
            elapsed = time.perf_counter() - started
            self._step_seconds = elapsed if self._step_seconds is None else 0.8 * self._step_seconds + 0.2 * elapsed
        except Exception:
            logger.exception("batched forward failed; retrying request by request")
            work, inputs, all_logits = self._forward_isolating(work, inputs)
        self.stats.record_forward(len(inputs), sum(len(i.token_ids) for i in inputs))
        to_sample: list[tuple[Request, Row, torch.Tensor]] = []
        beam_logits: dict[int, tuple[Request, list[torch.Tensor]]] = {}
        for item, row_input, logits in zip(work, inputs, all_logits, strict=True):
            if item.beam is not None:
                beam_logits.setdefault(id(item.request), (item.request, []))[1].append(logits[-1])
                continue
            try:
                to_sample.extend(self._consume(item, logits, row_input))
            except Exception as exc:
                logger.exception("request %s failed", item.request.request_id)
                self._fail(item.request, str(exc))
        for request, logits in beam_logits.values():
            request.beam_num_cached += 1
            self._advance_beams(request, torch.stack(logits), first=False)
        to_sample = [entry for entry in to_sample if entry[0].error is None]
        if to_sample:
            try:
                self._sample(to_sample)
            except Exception:
                logger.exception("batched sampling failed; retrying request by request")
                self._sample_isolating(to_sample)
        self._report({id(w.request): w.request for w in work}.values())
        # after finished requests left, so the gauges never show a stale batch
        self.observer.on_step(len(inputs), self.scheduler.num_running, self.scheduler.num_waiting, self.pool.usage)

    def _forward_isolating(
        self, work: list[_Work], inputs: list[RowInput]
    ) -> tuple[list[_Work], list[RowInput], list[torch.Tensor]]:
        """Find who broke a batched forward: one forward per request, fail only those that raise.

        Safe to repeat: a failed forward wrote K/V only beyond every row's committed length.
        """
        kept_work, kept_inputs, kept_logits = [], [], []
        for request in {id(w.request): w.request for w in work}.values():
            mine = [i for i, w in enumerate(work) if w.request is request]
            try:
                logits = self.runner.forward([inputs[i] for i in mine])
            except Exception as exc:
                self._fail(request, f"forward failed: {exc}")
                continue
            kept_work.extend(work[i] for i in mine)
            kept_inputs.extend(inputs[i] for i in mine)
            kept_logits.extend(logits)
        return kept_work, kept_inputs, kept_logits

    def _sample_isolating(self, entries: list[tuple[Request, Row, torch.Tensor]]) -> None:
        self._sampling_key = ()
        for request in {id(e[0]): e[0] for e in entries}.values():
            try:
                self._sample([e for e in entries if e[0] is request])
            except Exception as exc:
                logger.exception("request %s failed while sampling", request.request_id)
                self._fail(request, f"sampling failed: {exc}")
            finally:
                self._sampling_key = ()

    def _plan(self) -> tuple[list[_Work], list[RowInput]]:
        work: list[_Work] = []
        inputs: list[RowInput] = []
        self._draft_all()
        for request in self.scheduler.running:
            if not request.prefill_done:
                continue
            if request.beam is not None:
                for beam, row_input in enumerate(plan_beam_rows(request)):
                    work.append(_Work(request, None, 1, beam))
                    inputs.append(row_input)
                continue
            for row in request.rows:
                if row.finished:
                    continue
                if row.contrastive is not None:  # the candidates, as siblings at one position
                    candidates = row.contrastive.candidates
                    work.append(_Work(request, row, len(candidates)))
                    inputs.append(
                        RowInput(row.slot, row.num_cached, candidates, 0, True, hidden_layers=(self.num_layers,))
                    )
                    continue
                drafts = row.speculation.drafts if row.speculation is not None else []
                work.append(_Work(request, row, 1 + len(drafts)))
                inputs.append(
                    RowInput(
                        row.slot, row.num_cached, [row.output_ids[-1], *drafts], 0,
                        hidden_layers=self._hidden_for(request),
                    )
                )  # fmt: skip
        budget = self.scheduler.prefill_budget(sum(len(i.token_ids) for i in inputs))
        for request in self.scheduler.running:
            if request.prefill_done or budget <= 0:
                continue
            start = request.num_prefilled
            chunk = request.prompt_ids[start : start + budget]
            last = start + len(chunk) == len(request.prompt_ids)
            want_all = request.params.prompt_logprobs is not None
            logits_from = 0 if want_all else (len(chunk) - 1 if last else len(chunk))
            work.append(_Work(request, None, len(chunk)))
            inputs.append(
                RowInput(request.prefill_slot, start, chunk, logits_from, hidden_layers=self._hidden_for(request))
            )
            budget -= len(chunk)
        return work, inputs

    def _hidden_for(self, request: Request) -> tuple[int, ...]:
        if request.dola_layers is not None:
            return tuple(request.dola_layers)
        if request.params.strategy is Strategy.CONTRASTIVE:
            return (self.num_layers,)
        return ()

    def _next_logits(self, request: Request, logits: torch.Tensor, row_input: RowInput) -> torch.Tensor:
        """The ``[vocab_size]`` logits a row samples from: the model's, or DoLa's contrast."""
        if request.dola_layers is None:
            return logits[-1]
        layers = request.dola_layers
        # one LM-head matmul for all candidate layers at the last position: the head is read once
        stacked = torch.cat([row_input.hidden[layer][-1:] for layer in layers])  # [num_layers, hidden]
        projected = self.lm_head(stacked).float()  # [num_layers, vocab_size]
        premature = {layer: projected[i : i + 1] for i, layer in enumerate(layers)}
        return dola_contrast(logits[-1:], premature)[0]

    def _consume(
        self, item: _Work, logits: torch.Tensor, row_input: RowInput
    ) -> list[tuple[Request, Row, torch.Tensor]]:
        request = item.request
        if item.row is not None and item.row.contrastive is not None:
            self._consume_candidates(request, item.row, logits, row_input)
            return []
        if item.row is not None and item.row.speculation is not None and item.row.speculation.drafts:
            self._verify(request, item.row, logits)
            return []
        if item.row is not None:  # decode: this row's next token
            item.row.num_cached += 1
            return [(request, item.row, self._next_logits(request, logits, row_input))]
        start = request.num_prefilled
        request.num_prefilled += item.num_tokens
        if request.params.prompt_logprobs is not None:
            self._collect_prompt_logprobs(request, start, logits)
        if request.params.strategy is Strategy.CONTRASTIVE:
            request.prompt_hidden.append(row_input.hidden[self.num_layers])
        if not request.prefill_done:
            return []
        if request.beam is not None:
            request.beam_num_cached = len(request.prompt_ids)
            self._advance_beams(request, logits[-1].expand(request.params.num_beams, -1), first=True)
            return []
        first = request.rows[0]
        for row in request.rows:
            if row is not first:
                self.pool.copy_prefix(first.slot, row.slot, len(request.prompt_ids))
            row.num_cached = len(request.prompt_ids)
        if request.params.strategy is Strategy.CONTRASTIVE:
            prompt_hidden = torch.cat(request.prompt_hidden)  # [prompt_len, hidden]
            request.prompt_hidden = []
            for row in request.rows:
                row.contrastive.start(prompt_hidden, logits[-1])
                self._propose(row)
            return []
        next_logits = self._next_logits(request, logits, row_input)
        return [(request, row, next_logits) for row in request.rows]

    # ---- speculative decoding ------------------------------------------------------------------------
    def _draft_all(self) -> None:
        rows = []
        for request in self.scheduler.running:
            if not request.prefill_done:
                continue
            for row in request.rows:
                if row.finished or row.speculation is None:
                    continue
                left = request.params.max_new_tokens - len(row.output_ids) - 1
                room = self.limits.max_model_len - row.num_cached - 2
                rows.append((request, row, min(left, room)))
        if rows:
            try:
                self.drafter.draft(rows)
            except Exception:  # drafting is an optimisation: without drafts every row still decodes
                logger.exception("drafting failed; this step runs without drafts")
                for _, row, _ in rows:
                    row.speculation.drafts = []

    def _verify(self, request: Request, row: Row, logits: torch.Tensor) -> None:
        spec = row.speculation
        drafts = spec.drafts
        start = row.num_cached
        now = time.monotonic()
        gap = now - row.last_token_time if row.last_token_time is not None else None

        def commit(token: int, position_logits: torch.Tensor) -> bool:
            self._commit_token(request, row, token, position_logits, now)
            return row.finished

        accepted, emitted = verify_drafts(row.sampling, spec, logits, commit, self.device)
        row.num_cached = start + 1 + accepted  # rejected drafts: a length change, no copy
        self.drafter.rollback(row, len(row.sampling.history) - 1)
        cost_steps = spec.draft_seconds / self._step_seconds if self._step_seconds else 0.0
        spec.length.update(len(drafts), accepted, cost_steps)
        self.observer.on_speculation(spec.proposer, len(drafts), accepted)
        gaps = ([gap] if gap is not None else []) + [0.0] * (emitted - 1)
        self.observer.on_tokens(request.params.strategy.value, emitted, gaps)

    # ---- contrastive search ------------------------------------------------------------------------
    def _propose(self, row: Row) -> None:
        search = row.contrastive
        processed = SamplingBatch.from_rows([row.sampling], self.device).process(search.next_logits[None])
        search.propose(processed[0])

    def _consume_candidates(self, request: Request, row: Row, logits: torch.Tensor, row_input: RowInput) -> None:
        """Rank the sibling candidates just run, keep the winner's K/V, emit it, propose the next."""
        search = row.contrastive
        distribution = search.next_logits  # the raw logits the candidates were drawn from
        chosen = search.select(logits, row_input.hidden[self.num_layers])
        if chosen:
            self.pool.move_position(row.slot, row.num_cached + chosen, row.num_cached)
        row.num_cached += 1
        now = time.monotonic()
        gaps = [now - row.last_token_time] if row.last_token_time is not None else []
        self._commit_token(request, row, search.candidates[chosen], distribution, now)
        self.observer.on_tokens(request.params.strategy.value, 1, gaps)
        if not row.finished:
            self._propose(row)

    def _advance_beams(self, request: Request, logits: torch.Tensor, *, first: bool) -> None:
        try:
            if advance_beams(request, logits, self.pool, first=first):
                self._finish_beams(request)
        except Exception as exc:
            logger.exception("request %s failed", request.request_id)
            self._fail(request, str(exc))

    def _finish_beams(self, request: Request) -> None:
        num_tokens = finish_beams(request, self.eos_token_ids)
        strategy = request.params.strategy.value
        now = time.monotonic()
        request.first_token_time = now
        self.observer.on_first_token(strategy, now - request.arrival_time)
        self.observer.on_tokens(strategy, num_tokens, [])

    def _collect_prompt_logprobs(self, request: Request, start: int, logits: torch.Tensor) -> None:
        # logits[i] predicts prompt token start + i + 1
        if request.prompt_logprobs is None:
            request.prompt_logprobs = [
                TokenLogprob(request.prompt_ids[0], self._token_text(request.prompt_ids[0]), None)
            ]
        targets = request.prompt_ids[start + 1 : start + 1 + logits.shape[0]]
        request.prompt_logprobs.extend(
            prompt_logprob_entries(logits[: len(targets)], targets, request.params.prompt_logprobs, self._token_text)
        )

    def _sample(self, entries: list[tuple[Request, Row, torch.Tensor]]) -> None:
        """Pick every row's next token in one batched pass, then commit them row by row."""
        rows = [row for _, row, _ in entries]
        key = tuple(id(row) for row in rows)
        if key != self._sampling_key or self._sampling_batch is None:
            self._sampling_batch = SamplingBatch.from_rows([row.sampling for row in rows], self.device)
            self._sampling_key = key
        logits = torch.stack([entry[2] for entry in entries])  # [num_rows, vocab_size]
        batch = self._sampling_batch
        token_ids = batch.sample(batch.process(logits))
        now = time.monotonic()
        tokens_by_strategy: dict[str, int] = {}
        gaps: dict[str, list[float]] = {}
        for i, (request, row, _) in enumerate(entries):
            if request.error is not None:
                continue
            strategy = request.params.strategy.value
            tokens_by_strategy[strategy] = tokens_by_strategy.get(strategy, 0) + 1
            if row.last_token_time is not None:
                gaps.setdefault(strategy, []).append(now - row.last_token_time)
            try:
                self._commit_token(request, row, token_ids[i], logits[i], now)
            except Exception as exc:  # e.g. a detokenizer failure: this request alone fails
                logger.exception("request %s failed", request.request_id)
                self._fail(request, str(exc))
        for strategy, count in tokens_by_strategy.items():
            self.observer.on_tokens(strategy, count, gaps.get(strategy, []))

    def _commit_token(self, request: Request, row: Row, token: int, logits: torch.Tensor, now: float) -> None:
        if request.first_token_time is None:
            request.first_token_time = now
            self.observer.on_first_token(request.params.strategy.value, now - request.arrival_time)
        row.last_token_time = now
        row.output_ids.append(token)
        row.pending_ids.append(token)
        row.sampling.append(token)
        if request.params.logprobs is not None:
            row.pending_logprobs.append(token_logprob(logits, token, request.params.logprobs, self._token_text))
        self._check_stop(request, row, token)

    def _check_stop(self, request: Request, row: Row, token: int) -> None:
        params = request.params
        if token in self.eos_token_ids and not params.ignore_eos:
            row.finish_reason = FinishReason.STOP
        elif token in params.stop_token_ids:
            row.finish_reason, row.stop_reason = FinishReason.STOP, token
        else:
            row.streamer.put([token])
            if row.streamer.stop_reason is not None:
                row.finish_reason, row.stop_reason = FinishReason.STOP, row.streamer.stop_reason
        if row.finish_reason is None:
            at_context_end = len(request.prompt_ids) + len(row.output_ids) >= self.limits.max_model_len
            if len(row.output_ids) >= params.max_new_tokens or at_context_end:
                row.finish_reason = FinishReason.LENGTH
        if row.finish_reason is not None:
            row.streamer.end()

    # ---- finishing ----------------------------------------------------------------------------------
    def _expire(self, now: float) -> None:
        for request in list(self.requests.values()):
            if request.deadline is not None and now >= request.deadline:
                self._fail(request, f"request timed out after {self.limits.request_timeout:g} s")
            elif (
                request.params.max_time is not None
                and request.start_time is not None
                and now - request.start_time >= request.params.max_time
            ):
                # HF's MaxTimeCriteria: a graceful end, like running out of tokens
                if request.beam is not None:
                    if not request.finished:
                        request.beam.finish_now()
                        self._finish_beams(request)
                    self._report([request])
                    continue
                for row in request.rows:
                    if not row.finished:
                        row.finish_reason = FinishReason.LENGTH
                        row.streamer.end()
                self._report([request])

    def _fail(self, request: Request, message: str) -> None:
        request.error = f"request {request.request_id} failed: {message}"
        self._finish_request(request, FinishReason.ERROR)

    def _finish_request(self, request: Request, reason: FinishReason) -> None:
        self.scheduler.remove(request)
        self.drafter.release(request)
        self.requests.pop(request.request_id, None)
        self._sampling_key = ()
        self.emit(
            RequestOutput(
                request.request_id,
                num_prompt_tokens=len(request.prompt_ids),
                num_generated_tokens=request.num_generated,
                finished=True,
                error=request.error,
                deltas=[],
            )
        )
        self._record_finish(request, reason)

    def _report(self, requests: object) -> None:
        for request in requests:
            if request.request_id not in self.requests:
                continue
            with_logprobs = request.params.logprobs is not None
            deltas = [d for row in request.rows if (d := row.take_delta(with_logprobs)) is not None]
            output = RequestOutput(
                request.request_id,
                deltas=deltas,
                num_prompt_tokens=len(request.prompt_ids),
                num_generated_tokens=request.num_generated,
            )
            if request.prompt_logprobs is not None and request.prefill_done and not request.prompt_logprobs_sent:
                output.prompt_logprobs = request.prompt_logprobs
                request.prompt_logprobs_sent = True
            if request.finished:
                output.finished = True
                self.scheduler.remove(request)
                self.drafter.release(request)
                self.requests.pop(request.request_id, None)
                self._sampling_key = ()
                self._record_finish(request, None)
            if deltas or output.finished or output.prompt_logprobs:
                self.emit(output)

    def _record_finish(self, request: Request, reason: FinishReason | None) -> None:
        reason = self.stats.record_finish(request, reason)
        self.observer.on_finished(request.params.strategy.value, reason.value, time.monotonic() - request.arrival_time)

    def _token_text(self, token_id: int) -> str:
        return token_text(self.tokenizer, token_id)
