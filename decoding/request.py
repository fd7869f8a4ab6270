"""Per-request state inside the worker: its rows (one per returned sequence), slots and progress.

A request is created by the engine when the client submits it and lives until its last row
finishes; rows own KV slots only while the request is running.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from decoding.outputs import FinishReason, SequenceDelta, TokenLogprob
from decoding.params import GenerationParams


class RequestState(str, Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Row:
    """One sequence of a request: a KV slot, its generated ids and its text stream."""

    index: int
    sampling: Any  # decoding.sampling RowSamplingState
    streamer: Any  # decoding.streamer.DeltaStreamer
    slot: int | None = None
    num_cached: int = 0  # tokens whose K/V are in the slot
    output_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    # emitted since the last output, flushed into a SequenceDelta by the engine
    pending_ids: list[int] = field(default_factory=list)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    reported_finish: bool = False
    last_token_time: float | None = None
    sequence_score: float | None = None  # beam search: the final (length-penalised) score
    contrastive: Any = None  # decoding.strategies.contrastive.ContrastiveSearch for penalty_alpha rows
    speculation: Any = None  # decoding.strategies.speculative.Speculation for assisted rows

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def take_delta(self, with_logprobs: bool) -> SequenceDelta | None:
        text = self.streamer.take()
        if not self.pending_ids and not text and (self.reported_finish or not self.finished):
            return None
        delta = SequenceDelta(
            index=self.index,
            text=text,
            token_ids=self.pending_ids,
            logprobs=self.pending_logprobs if with_logprobs else None,
        )
        self.pending_ids, self.pending_logprobs = [], []
        if self.finished and not self.reported_finish:
            delta.finish_reason = self.finish_reason
            delta.stop_reason = self.stop_reason
            delta.sequence_score = self.sequence_score
            self.reported_finish = True
        return delta


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    params: GenerationParams
    rows: list[Row]
    generator: Any = None  # torch.Generator shared by the request's rows, in row order
    arrival_time: float = field(default_factory=time.monotonic)
    deadline: float | None = None  # server-side request timeout
    start_time: float | None = None  # admission
    first_token_time: float | None = None
    state: RequestState = RequestState.WAITING
    num_prefilled: int = 0  # prompt tokens already written into rows[0]'s slot
    prompt_logprobs: list[TokenLogprob] | None = None
    prompt_logprobs_sent: bool = False
    error: str | None = None
    # beam family: the search state, and the num_beams KV slots it works in (rows hold no slot)
    beam: Any = None  # decoding.strategies.beam.BeamSearch
    beam_slots: list[int] = field(default_factory=list)
    beam_num_cached: int = 0
    beam_next_tokens: list[int] = field(default_factory=list)
    dola_layers: list[int] | None = None  # DoLa's candidate premature layers
    prompt_hidden: list[Any] = field(default_factory=list)  # contrastive: final hidden states per chunk

    @property
    def num_slots(self) -> int:
        return self.params.num_beams if self.beam is not None else len(self.rows)

    def assign_slots(self, slots: list[int]) -> None:
        if self.beam is not None:
            self.beam_slots = list(slots)
        else:
            for row, slot in zip(self.rows, slots, strict=True):
                row.slot = slot

    def release_slots(self) -> list[int]:
        """Every slot this request holds, now given up."""
        slots = [row.slot for row in self.rows if row.slot is not None] + self.beam_slots
        for row in self.rows:
            row.slot = None
        self.beam_slots = []
        return slots

    @property
    def prefill_slot(self) -> int:
        """The slot the prompt is written into; other rows or beams copy it once prefilled."""
        return self.beam_slots[0] if self.beam is not None else self.rows[0].slot

    @property
    def prefill_done(self) -> bool:
        return self.num_prefilled >= len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return all(row.finished for row in self.rows)

    @property
    def num_generated(self) -> int:
        return sum(len(row.output_ids) for row in self.rows)
