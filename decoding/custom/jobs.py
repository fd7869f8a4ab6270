"""Custom decoding methods (HF's ``custom_generate``) run as exclusive jobs between engine steps.

A custom ``generate()`` calls the model itself, so it cannot share the batched forward the
strategies share. The engine queues such a request here; before each step it runs the oldest one
to its end, then the batch resumes (the other requests' K/V stay in the pool untouched, their
clocks keep running). While the job runs, the model uses transformers' ``sdpa`` attention, since
Decoda's packed attention only works inside the runner's step layout.

Loading the methods at start is ``decoding.custom.loading``'s business; the HF interfaces the
method is handed are ``decoding.custom.hf_bridge``.

The job talks to the method through HF's interfaces: a ``BaseStreamer`` whose ``put()``/``end()``
turn tokens into the same ``RequestOutput`` deltas every request streams, and a
``StoppingCriteria`` that fires when the client disconnects or a time limit passes. A method that
ignores its stopping criteria is stopped anyway: a forward pre-hook raises at its next model call;
one that never calls the model is interrupted by the watchdog (``decoding.custom.deadline``) past
its deadline (``--request-timeout``, ``max_time``, or ``DEFAULT_DEADLINE`` when neither is set),
and ``/health`` turns red when even that cannot stop it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

import torch
from transformers import StoppingCriteriaList

from decoding.custom.deadline import DeadlineExceeded, Watchdog
from decoding.custom.hf_bridge import (
    CustomJob,
    Interrupted,
    JobOutput,
    JobStopping,
    find_prompt,
    generation_config_for,
    interruptible,
    sdpa,
    seeded,
)
from decoding.custom.loading import LoadedMethod
from decoding.outputs import FinishReason, RequestOutput
from decoding.params import GenerationParams
from decoding.telemetry import EngineObserver

logger = logging.getLogger(__name__)

STRATEGY = "custom"  # the strategy label of metrics
DEFAULT_DEADLINE = 600.0  # seconds a job may run when neither --request-timeout nor max_time bounds it


class CustomJobs:
    """The engine's queue of custom-method requests, run one at a time between steps."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: object,
        eos_token_ids: list[int],
        device: torch.device,
        emit: Callable[[RequestOutput], None],
        observer: Callable[[], EngineObserver],
        timeout: float | None = None,
        methods: dict[str, LoadedMethod] | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = list(eos_token_ids)
        self.device = device
        self.emit = emit
        self.observer = observer
        self.timeout = timeout  # the server's --request-timeout, from arrival
        self.methods = dict(methods or {})
        self.queue: deque[CustomJob] = deque()
        # aborts arrive from the event loop while a job holds the worker thread: a flag it can read
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self.running: CustomJob | None = None
        self.stopping = False  # the worker is stopping (drain deadline passed): the running job ends now
        self.watchdog = Watchdog()

    # ---- from the engine (worker thread) ------------------------------------------------------------
    def add(self, request_id: str, prompt_ids: list[int], params: GenerationParams) -> None:
        if params.custom_generate not in self.methods:
            raise ValueError(f"custom_generate '{params.custom_generate}' is not registered on this server")
        self.queue.append(CustomJob(request_id, list(prompt_ids), params))

    def has_work(self) -> bool:
        return bool(self.queue)

    def abort(self, request_id: str) -> bool:
        """Drop a queued job (its end is not read); False when ``request_id`` is not one of ours."""
        with self._lock:
            self._cancelled.discard(request_id)
        for job in list(self.queue):
            if job.request_id == request_id:
                self.queue.remove(job)
                self._end(job, error=None, code="internal")
                return True
        return False

    def fail_all(self, message: str, code: str) -> None:
        while self.queue:
            self._end(self.queue.popleft(), error=message, code=code)

    def run_next(self) -> bool:
        """Run the oldest queued job to its end (the other requests wait; they resume after it); False
        when none was queued."""
        if not self.queue:
            return False
        job = self.queue.popleft()
        self.running = job
        try:
            self._run(job)
        finally:
            self.running = None
            with self._lock:
                self._cancelled.discard(job.request_id)
        return True

    # ---- from any thread -------------------------------------------------------------------------------
    def cancel(self, request_id: str) -> None:
        """The client went away: the running job's stopping criterion fires at its next check.

        Flagged whatever ``request_id`` is (a job may be starting right now); the abort command that
        follows through the worker's inbox clears the flag (``abort``)."""
        with self._lock:
            self._cancelled.add(request_id)

    def stop(self) -> None:
        """The worker stops after this step: the running job ends as "unavailable", like the batch's requests."""
        self.stopping = True

    def is_cancelled(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._cancelled

    # ---- the job ----------------------------------------------------------------------------------------
    def _run(self, job: CustomJob) -> None:
        method = self.methods[job.params.custom_generate]
        started = time.monotonic()
        self.observer().on_admitted(STRATEGY, started - job.arrival_time, len(job.prompt_ids))
        output = JobOutput(job, self.tokenizer, self.emit)
        stopping = JobStopping(lambda: self.stopping or self.is_cancelled(job.request_id), self._deadline(job, started),
                               lambda: len(output.token_ids), job.params.max_new_tokens)  # fmt: skip
        kwargs = dict(job.params.custom_generate_args or {})
        if method.takes_streamer:
            kwargs["streamer"] = output
        if method.takes_stopping_criteria:
            kwargs["stopping_criteria"] = StoppingCriteriaList([stopping])
        pad = getattr(self.model.generation_config, "pad_token_id", None)
        config = generation_config_for(job.params, self.eos_token_ids, pad)
        input_ids = torch.tensor([job.prompt_ids], dtype=torch.long, device=self.device)
        result: object = None
        deadline = self._deadline(job, started) or started + DEFAULT_DEADLINE
        label = f"custom_generate '{method.info.name}' (request {job.request_id})"
        try:
            with self.watchdog.watch(label, deadline), sdpa(self.model), seeded(job.params.seed, self.device), \
                    interruptible(self.model, stopping):
                result = method.function(model=self.model, input_ids=input_ids, generation_config=config, **kwargs)
        except Interrupted:
            result = None
        except DeadlineExceeded:
            logger.error("%s ran past its deadline without stopping; interrupted", label)
            self._end(job, f"{label} ran past its deadline ({deadline - started:.0f} s) without stopping or calling "
                      "the model; it was interrupted", "internal")  # fmt: skip
            return
        except (ValueError, TypeError) as exc:  # the method refused the request's arguments: the request's fault
            logger.warning("custom_generate %s failed for %s: %s", method.info.name, job.request_id, exc)
            self._end(job, f"custom_generate '{method.info.name}' failed: {exc}", "invalid_request")
            return
        except Exception as exc:
            logger.exception("custom_generate %s failed for %s", method.info.name, job.request_id)
            self._end(job, f"custom_generate '{method.info.name}' failed: {exc}", "internal")
            return
        if self.is_cancelled(job.request_id):
            self._end(job, error=None, code="internal")
            return
        if self.stopping:
            self._end(job, "the server stopped before this request finished; retry it", "unavailable")
            return
        try:
            generated = self._generated(job, output.token_ids, result)
        except ValueError as exc:
            self._end(job, f"custom_generate '{method.info.name}': {exc}", "internal")
            return
        limit = job.params.max_new_tokens
        rest = generated[len(output.token_ids) :][: max(0, limit - len(output.token_ids))]
        total = output.token_ids + rest
        stopped = bool(total) and total[-1] in self.eos_token_ids
        reason = FinishReason.STOP if stopped else FinishReason.LENGTH
        output.send(rest, finish=reason)
        observer = self.observer()
        if output.first_token_time is not None:
            observer.on_first_token(STRATEGY, output.first_token_time - job.arrival_time)
        observer.on_tokens(STRATEGY, len(total), [])
        observer.on_finished(STRATEGY, reason.value, time.monotonic() - job.arrival_time)

    def _deadline(self, job: CustomJob, started: float) -> float | None:
        """HF's ``MaxTimeCriteria`` counts ``max_time`` from the call; --request-timeout counts from arrival."""
        limits = [job.arrival_time + self.timeout if self.timeout else None]
        limits.append(started + job.params.max_time if job.params.max_time else None)
        known = [limit for limit in limits if limit is not None]
        return min(known) if known else None

    def _generated(self, job: CustomJob, streamed: list[int], result: object) -> list[int]:
        """The ids the method generated: what follows the prompt in its return value (a ``[1, L]``
        tensor or an output with ``sequences``), else what it streamed (it was interrupted)."""
        if result is None:
            return streamed
        sequences = getattr(result, "sequences", result)
        if not isinstance(sequences, torch.Tensor) or sequences.dim() != 2 or sequences.shape[0] != 1:
            raise ValueError("generate() must return a [1, length] tensor of token ids (or an output with `sequences`)")
        ids = sequences[0].tolist()
        start = find_prompt(ids, job.prompt_ids)  # a method may add tokens before the prompt (left padding)
        if start is None:
            raise ValueError("the sequence generate() returned does not contain the prompt")
        generated = ids[start + len(job.prompt_ids) :]
        if generated[: len(streamed)] != streamed:
            raise ValueError("the sequence generate() returned differs from the tokens it streamed")
        return generated

    def _end(self, job: CustomJob, error: str | None, code: str) -> None:
        """End a job that did not finish by itself (aborted or failed)."""
        self.emit(RequestOutput(job.request_id, num_prompt_tokens=len(job.prompt_ids), finished=True,
                                error=error, error_code=code))  # fmt: skip
        reason = "abort" if error is None else "error"
        self.observer().on_finished(STRATEGY, reason, time.monotonic() - job.arrival_time)
