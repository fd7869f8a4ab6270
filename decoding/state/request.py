"""Per-request state inside the worker: its prompt, its rows (one per returned sequence), its clock.

A request is created by the engine when the client submits it and lives until its last row
finishes. How its rows are decoded (and which KV slots they hold) is its strategy's business
(``decoding/strategies``: the engine holds each request's strategy, and the strategy its request); the
request only knows what every strategy shares: the prompt and how
much of it is prefilled, the rows the user gets back, and the time limits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from decoding.model.seq2seq import EncoderInput
from decoding.outputs import FinishReason, RequestOutput, SequenceDelta, TokenLogprob
from decoding.params import GenerationParams
from decoding.params.lengths import new_token_limit
from decoding.sampling import RowSamplingState, make_generator
from decoding.sampling.grammar import mask_budget_of
from decoding.state.context import EngineContext
from decoding.text.stop import StopChecker, StopStrings
from decoding.text.streamer import DeltaStreamer
from decoding.vision.prompt import ImagePrompt


@dataclass
class Row:
    """One returned sequence: its generated ids, its text stream, how it stops."""

    index: int
    sampling: RowSamplingState  # the processors' per-row memory (and the request's generator)
    streamer: DeltaStreamer
    stop: StopChecker
    slot: int | None = None  # its KV slot, for strategies that decode row by row
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
    num_draft_tokens: int = 0  # speculative decoding: drafts the target verified for this row
    num_accepted_draft_tokens: int = 0  # ... and those it kept (the row's acceptance rate)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, token: int, logprob: TokenLogprob | None) -> None:
        """One generated token: remember it, stream its text, and stop where a stop rule says."""
        self.output_ids.append(token)
        self.pending_ids.append(token)
        if logprob is not None:
            self.pending_logprobs.append(logprob)
        self.sampling.append(token)
        grammar_done = self.sampling.grammar is not None and self.sampling.grammar.done
        finish = self.stop.finish_after(token, self.streamer, self.sampling.history, len(self.output_ids), grammar_done)
        if finish is not None:
            self.finish(*finish)

    def finish(self, reason: FinishReason, stop_reason: str | int | None = None) -> None:
        if self.finished:
            return
        self.finish_reason, self.stop_reason = reason, stop_reason
        self.streamer.end()

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
    arrival_time: float = field(default_factory=time.monotonic)
    timeout: float | None = None  # the server's --request-timeout, from arrival
    start_time: float | None = None  # admission; HF's max_time counts from here
    first_token_time: float | None = None
    num_prefilled: int = 0  # prompt tokens whose K/V are written into the prefill slot
    num_cached_tokens: int = 0  # prompt tokens the prefix cache supplied (OpenAI's cached_tokens)
    prompt_logprobs: list[TokenLogprob] | None = None
    prompt_logprobs_sent: bool = False
    error: str | None = None
    # an encoder-decoder model's request: what its encoder reads, and the pool slot holding the encoder's
    # keys and values once it ran (``decoding.model.seq2seq``); ``prompt_ids`` are then the decoder's prompt
    encoder_input: EncoderInput | None = None
    encoder_length: int = 0
    cross_slot: int | None = None
    encoded: bool = False
    # a vision-language model's request: its prompt's images (``decoding.vision.prompt``)
    image_prompt: ImagePrompt | None = None
    # where the prompt's text starts: after GIT's image positions (``vision.git_prompt``), else 0
    text_start: int = 0

    @classmethod
    def create(
        cls,
        request_id: str,
        prompt_ids: list[int],
        params: GenerationParams,
        tokenizer: object,
        ctx: EngineContext,
        timeout: float | None,
        text_start: int = 0,
    ) -> Request:
        """A request with its ``n`` rows, each with its sampling memory, text stream and stop rules.
        ``text_start``: the prompt's ids before it are GIT's image positions, which ``generate()``'s ``input_ids``
        do not hold: the rows' knobs (repetition penalty, n-grams, stop strings, ``max_length``) read the rest."""
        generator = make_generator(params.seed, ctx.device) if params.do_sample else None
        text = list(prompt_ids[text_start:])
        max_new_tokens = min(new_token_limit(params, len(text)), ctx.max_model_len - len(prompt_ids))
        eos = set(ctx.eos_token_ids)

        def decode(ids: list[int]) -> str:
            return tokenizer.decode(ids, skip_special_tokens=params.skip_special_tokens)

        stop_strings = StopStrings(tokenizer, params.stop_strings) if params.stop_strings else None
        budget = mask_budget_of(params)  # one for all the request's rows

        rows = [
            Row(
                index=index,
                sampling=RowSamplingState(
                    params, text, ctx.eos_token_ids, ctx.vocab_size, generator, ctx.device, budget
                ),
                streamer=DeltaStreamer(tokenizer, text, params.stop, params.skip_special_tokens),
                stop=StopChecker(params, eos, max_new_tokens, decode, stop_strings, text),
            )
            for index in range(params.n)
        ]
        return cls(request_id, list(prompt_ids), params, rows, timeout=timeout, text_start=text_start)

    @property
    def text_ids(self) -> list[int]:
        """The prompt as ``generate()``'s ``input_ids`` hold it (GIT's image positions left out)."""
        return self.prompt_ids[self.text_start :]

    @property
    def num_input_tokens(self) -> int:
        """What the user's usage counts as the prompt: an encoder-decoder's encoder input and decoder
        prompt (Whisper's features count as the encoder's positions), else the prompt."""
        return self.encoder_length + len(self.prompt_ids)

    def take_output(self) -> RequestOutput:
        """What happened since the last output: every row's new tokens and text, the prompt's
        logprobs once the prompt is in."""
        with_logprobs = self.params.logprobs is not None
        deltas = [d for row in self.rows if (d := row.take_delta(with_logprobs)) is not None]
        output = RequestOutput(
            self.request_id,
            deltas=deltas,
            num_prompt_tokens=self.num_input_tokens,
            num_cached_tokens=self.num_cached_tokens,
            num_generated_tokens=self.num_generated,
            num_draft_tokens=sum(row.num_draft_tokens for row in self.rows),
            num_accepted_draft_tokens=sum(row.num_accepted_draft_tokens for row in self.rows),
        )
        if self.prompt_logprobs is not None and self.prefill_done and not self.prompt_logprobs_sent:
            output.prompt_logprobs = self.prompt_logprobs
            self.prompt_logprobs_sent = True
        return output

    @property
    def prefill_done(self) -> bool:
        return self.num_prefilled >= len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return all(row.finished for row in self.rows)

    @property
    def num_generated(self) -> int:
        return sum(len(row.output_ids) for row in self.rows)

    def expired(self, now: float) -> bool:
        """Past ``--request-timeout`` (from arrival) or ``max_time`` (from admission, as HF counts
        from the ``generate()`` call): both end the request as HF's ``MaxTimeCriteria`` does."""
        if self.timeout is not None and now - self.arrival_time >= self.timeout:
            return True
        max_time = self.params.max_time
        return max_time is not None and self.start_time is not None and now - self.start_time >= max_time

    def deadline(self) -> float | None:
        """The ``time.monotonic()`` at which ``expired`` turns true, if a time limit applies yet."""
        ends = []
        if self.timeout is not None:
            ends.append(self.arrival_time + self.timeout)
        if self.params.max_time is not None and self.start_time is not None:
            ends.append(self.start_time + self.params.max_time)
        return min(ends, default=None)

    def overall_finish_reason(self) -> FinishReason:
        """One reason for the whole request, for metrics: stop when any row stopped."""
        reasons = {row.finish_reason for row in self.rows}
        return FinishReason.STOP if FinishReason.STOP in reasons else FinishReason.LENGTH
