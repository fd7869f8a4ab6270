"""How a custom ``generate()`` and the engine talk: HF's own interfaces, adapted to a job.

A custom method expects what HF's ``generate()`` hands it: a ``GenerationConfig``, a
``BaseStreamer`` and ``StoppingCriteria``. ``JobOutput`` is the streamer whose ``put()``/``end()``
turn tokens into the same ``RequestOutput`` deltas every request streams; ``JobStopping`` fires
when the client disconnects or a time limit passes; and the context managers set up the model for
the method (transformers' own attention, the request's seed, a forward pre-hook that stops a
method that ignores its stopping criteria).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig, StoppingCriteria
from transformers.generation.streamers import BaseStreamer

from decoding.outputs import FinishReason, RequestOutput, SequenceDelta
from decoding.params import GenerationParams
from decoding.params.custom_methods import CONFIG_FIELDS
from decoding.text.streamer import DeltaStreamer


def generation_config_for(
    params: GenerationParams, eos_token_ids: list[int], pad_token_id: int | None
) -> GenerationConfig:
    """The request's GenerationConfig knobs, as ``generate(generation_config=...)`` would get them."""
    defaults = GenerationParams()  # only what the request sets: GenerationConfig warns about unused beam knobs
    knobs = {name: getattr(params, name) for name in CONFIG_FIELDS if hasattr(params, name)}
    knobs = {name: value for name, value in knobs.items() if value != getattr(defaults, name)}
    knobs["max_new_tokens"] = params.max_new_tokens
    if knobs.get("sequence_bias") is not None:  # the request's [[ids], bias] pairs, as GenerationConfig keys them
        knobs["sequence_bias"] = {tuple(ids): bias for ids, bias in knobs["sequence_bias"]}
    return GenerationConfig(**knobs, eos_token_id=list(eos_token_ids), pad_token_id=pad_token_id)


class Interrupted(Exception):
    """Raised into the method by the forward pre-hook once its stopping criterion has fired."""


class JobStopping(StoppingCriteria):
    """HF's ``StoppingCriteria``: true once the client went away, the time limit passed, or the
    method streamed ``max_new_tokens`` (HF's ``MaxTimeCriteria`` and ``MaxLengthCriteria``)."""

    def __init__(
        self, cancelled: Callable[[], bool], deadline: float | None, num_streamed: Callable[[], int], limit: int
    ) -> None:
        self.cancelled = cancelled
        self.deadline = deadline
        self.num_streamed = num_streamed
        self.limit = limit

    @property
    def timed_out(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def should_stop(self) -> bool:
        return self.cancelled() or self.timed_out or self.num_streamed() >= self.limit

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: object) -> torch.BoolTensor:
        stop = self.should_stop()
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


@dataclass
class CustomJob:
    request_id: str
    prompt_ids: list[int]
    params: GenerationParams
    arrival_time: float = field(default_factory=time.monotonic)


class JobOutput(BaseStreamer):
    """The job's side of HF's streamer interface: ``put()`` new ids (the first put is the prompt,
    skipped as HF's ``TextStreamer(skip_prompt=True)`` does), each becoming a ``RequestOutput`` delta."""

    def __init__(self, job: CustomJob, tokenizer: object, emit: Callable[[RequestOutput], None]) -> None:
        self.job = job
        self.emit = emit
        self.text = DeltaStreamer(tokenizer, job.prompt_ids, (), job.params.skip_special_tokens)
        self.token_ids: list[int] = []
        self._prompt_seen = False
        self.first_token_time: float | None = None

    def put(self, value: object) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        ids = [
            int(t) for t in torch.as_tensor(value, device="cpu").reshape(-1).tolist()
        ]  # a tensor, a list or an int; one row
        self.send(ids[: max(0, self.job.params.max_new_tokens - len(self.token_ids))])  # max_tokens caps a stream

    def end(self) -> None:
        """The method says it is done; the job finishes the stream once it has the return value."""

    def send(self, ids: list[int], finish: FinishReason | None = None) -> None:
        if ids and self.first_token_time is None:
            self.first_token_time = time.monotonic()
        self.token_ids.extend(ids)
        if ids:
            self.text.put(ids)
        if finish is not None:
            self.text.end()
        text = self.text.take()
        if not ids and not text and finish is None:
            return
        delta = SequenceDelta(index=0, text=text, token_ids=list(ids), finish_reason=finish)
        self.emit(
            RequestOutput(
                self.job.request_id,
                deltas=[delta],
                num_prompt_tokens=len(self.job.prompt_ids),
                num_generated_tokens=len(self.token_ids),
                finished=finish is not None,
            )
        )


def find_prompt(haystack: list[int], needle: list[int]) -> int | None:
    for start in range(len(haystack) - len(needle) + 1):
        if haystack[start : start + len(needle)] == needle:
            return start
    return None


@contextlib.contextmanager
def sdpa(model: torch.nn.Module) -> Iterator[None]:
    """transformers' own attention while the method runs; the engine's packed attention after.

    Under ``--compile`` the layers' graphs were traced with the engine's attention and the server
    checks only the guards that tell those graphs apart, so the method runs the layers eagerly.
    """
    previous = model.config._attn_implementation
    with torch.compiler.set_stance("force_eager"):
        if previous in ("sdpa", "eager"):  # transformers' own already (GIT takes eager only: its layers run their own
            # attention outside a step, ``model.git_forward``)
            yield
            return
        model.set_attn_implementation("sdpa")
        try:
            yield
        finally:
            model.set_attn_implementation(previous)


@contextlib.contextmanager
def seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """With ``seed``: what ``torch.manual_seed(seed); model.generate(...)`` draws, without moving the
    process's global generator for anyone else."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def interruptible(model: torch.nn.Module, stopping: JobStopping) -> Iterator[None]:
    """Stop a method that never checks its stopping criteria at its next forward."""

    def check(*_: object) -> None:
        if stopping.should_stop():
            raise Interrupted

    handle = model.register_forward_pre_hook(check)
    try:
        yield
    finally:
        handle.remove()
