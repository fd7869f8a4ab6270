"""Speech to text with Whisper, on the engine client: the audio in 30 s windows, each window one request of
the continuous batch.

The uploaded file is decoded (``decoding/audio``) and turned into log-mel features once (with 30 s of
silence after it, as openai-whisper pads), off the event loop. Each window is then submitted like any
request (its features are the encoder's input, so it shares the batch with every other request and gets
every strategy and knob), with Whisper's prompt: the previous window's text (``<|startofprev|>``, the
request's ``prompt`` before the first), ``<|startoftranscript|>``, the language (detected from the first
window by one decoder step when not given, as Whisper's ``detect_language``), the task, and
``<|notimestamps|>`` unless timestamps are wanted; Whisper's suppressions and timestamp rules ride on
the request (``GenerationParams.whisper``). Where the next window starts, and the segments, follow
openai-whisper's ``transcribe()`` (``decoding/text/whisper_windows.py``); so does the temperature
fallback: a window whose text repeats itself (compression ratio > 2.4) or that the model doubts
(average log probability < -1) is decoded again at the next temperature.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from decoding.engine.word_alignment import alignment_scores
from decoding.model.seq2seq import EncoderInput
from decoding.params import GenerationParams, ParameterError
from decoding.params.seq2seq_checks import check_seq2seq_request
from decoding.params.whisper import WhisperRules
from decoding.telemetry import EngineObserver
from decoding.text.whisper_windows import (
    FRAMES_PER_WINDOW,
    WindowSegment,
    compression_ratio,
    single_timestamp_ending,
    window_segments,
)
from decoding.text.word_timing import TimedSegment, align_words, time_segments
from decoding.transcripts import (
    TranscriptionJob,
    TranscriptionUpdate,
    TranscriptSegment,
    TranscriptToken,
    TranscriptWord,
)

SAMPLE_RATE = 16_000
HOP = 160  # samples per feature frame
MAX_TEXT_POSITIONS = 448  # Whisper's decoder context
PREVIOUS_TEXT_TOKENS = 223  # openai-whisper: at most n_text_ctx // 2 - 1 tokens of previous text
COMPRESSION_RATIO_THRESHOLD = 2.4
LOGPROB_THRESHOLD = -1.0
NO_SPEECH_THRESHOLD = 0.6
NO_SPEECH_TOP = 20  # the prompt's top tokens read for the no-speech probability


@dataclass
class _Decoded:
    tokens: list[int]  # without end of text
    logprobs: list[float]  # each generated token's, end of text included
    temperature: float
    compression_ratio: float  # of the window's text (openai-whisper's repetition measure)

    @property
    def avg_logprob(self) -> float:
        return sum(self.logprobs) / (len(self.tokens) + 1)


class Transcriber:
    """Whisper's windows over the engine client's ``generate`` (``submit``)."""

    def __init__(self, tokenizer: Any, feature_extractor: Any, generation_config: Any, eos_token_id: int,
                 submit: Callable[..., AsyncIterator], off_loop: Callable, max_seconds: float,
                 on_model: Callable[[Callable[[torch.nn.Module], Any]], Awaitable[Any]]) -> None:  # fmt: skip
        self.tokenizer = tokenizer
        self.on_model = on_model  # runs work(model) on the worker thread (word timestamps' extra pass)
        self.features = feature_extractor
        self.config = generation_config
        self.eos = eos_token_id
        self.submit = submit
        self.off_loop = off_loop
        self.max_seconds = max_seconds
        self.observer = EngineObserver()  # the client's (metrics: audio seconds, real-time factor)
        vocab = tokenizer.get_vocab()
        self.sot = vocab["<|startoftranscript|>"]
        self.previous = vocab["<|startofprev|>"]
        self.no_timestamps = vocab["<|notimestamps|>"]
        self.no_speech = vocab.get("<|nospeech|>", vocab.get("<|nocaptions|>"))
        self.tasks = {task: vocab[f"<|{task}|>"] for task in ("transcribe", "translate")}
        tokens = {f"<|{code}|>" for code in _language_names()}
        self.languages = {token[2:-2]: i for token, i in vocab.items() if token in tokens}

    async def run(self, request_id: str, job: TranscriptionJob) -> AsyncIterator[TranscriptionUpdate]:
        check_seq2seq_request(job.params, 0, None)  # what an encoder-decoder model does not run: a 400 naming it
        started = time.monotonic()
        samples, mel = await self.off_loop(lambda: self._features(job.audio))
        frames = len(samples) // HOP
        language = await self._language(request_id, job, mel)
        head = [self.sot, self.languages[language], self.tasks[job.task]]
        if not job.timestamps:
            head.append(self.no_timestamps)
        prior = self._prompt_tokens(job.prompt) if job.prompt else []
        segments: list[TranscriptSegment] = []
        words: list[TranscriptWord] = []
        seek, number, generated, last_speech = 0, 0, 0, 0.0
        while seek < frames:
            window_frames = min(FRAMES_PER_WINDOW, frames - seek)
            window = torch.from_numpy(np.ascontiguousarray(mel[:, seek : seek + FRAMES_PER_WINDOW]))
            decoded, no_speech = await self._decode_window(f"{request_id}-w{number}", job, window, head, prior)
            number += 1
            generated += len(decoded.logprobs)
            if no_speech > NO_SPEECH_THRESHOLD and decoded.avg_logprob < LOGPROB_THRESHOLD:
                seek += window_frames  # silence: nothing said here
                continue
            window_seek = seek
            pieces, seek = window_segments(decoded.tokens, self.no_timestamps + 1, seek, window_frames, self._text)
            timed: dict[int, TimedSegment] = {}
            if job.word_timestamps:
                timed, last_speech = await self._word_times(pieces, window, window_seek, window_frames, head[:3],
                                                            language, last_speech)  # fmt: skip
                if not single_timestamp_ending(decoded.tokens, self.no_timestamps + 1):
                    ends = [t.words[-1].end for t in timed.values() if t.words]  # openai-whisper: the next window
                    if ends and ends[-1] > window_seek * 0.01:  # starts where the last word ended
                        seek = round(ends[-1] * 100)
            position = 0
            for number_in_window, piece in enumerate(pieces):
                if not piece.text.strip() and piece.end <= piece.start:
                    position += len(piece.tokens)
                    continue
                if number_in_window in timed:
                    piece.start, piece.end = timed[number_in_window].start, timed[number_in_window].end
                    words.extend(TranscriptWord(w.word.strip(), w.start, w.end)
                                 for w in timed[number_in_window].words)  # fmt: skip
                segment = TranscriptSegment(
                    id=len(segments), seek=window_seek, start=round(piece.start, 2), end=round(piece.end, 2),
                    text=piece.text, tokens=piece.tokens, temperature=decoded.temperature,
                    avg_logprob=decoded.avg_logprob, compression_ratio=decoded.compression_ratio,
                    no_speech_prob=no_speech,
                )  # fmt: skip
                segments.append(segment)
                tokens = [] if not job.logprobs else self._token_logprobs(piece.tokens, decoded.logprobs, position)
                position += len(piece.tokens)
                yield TranscriptionUpdate(text=piece.text, segment=segment, logprobs=tokens)
            # the next window continues from this one's text, unless it was sampled hot (openai-whisper)
            prior = [] if decoded.temperature > 0.5 else (prior + decoded.tokens)[-PREVIOUS_TEXT_TOKENS:]
        self.observer.on_transcribed(len(samples) / SAMPLE_RATE, time.monotonic() - started)
        yield TranscriptionUpdate(
            done=True, language=_language_names().get(language, language),
            duration=round(len(samples) / SAMPLE_RATE, 3), segments=segments, words=words,
            audio_tokens=number * FRAMES_PER_WINDOW // 2, output_tokens=generated,
        )  # fmt: skip

    # ---- the audio --------------------------------------------------------------------------------------
    def _features(self, audio: bytes) -> tuple[np.ndarray, np.ndarray]:
        """(the 16 kHz samples, their log-mel features with 30 s of silence after them)."""
        from decoding.audio import AudioInputError, decode_audio  # PyAV loads only where speech is served

        try:
            samples = decode_audio(audio, max_seconds=self.max_seconds)
        except AudioInputError as error:
            raise ParameterError(f"file: {error}", param="file", code="invalid_audio") from error
        padded = np.concatenate([samples, np.zeros(FRAMES_PER_WINDOW * HOP, dtype=np.float32)])
        mel = self.features(padded, sampling_rate=SAMPLE_RATE, return_tensors="np", padding=False,
                            truncation=False).input_features[0]  # fmt: skip
        return samples, mel.astype(np.float32)

    # ---- one window -------------------------------------------------------------------------------------
    async def _decode_window(self, request_id: str, job: TranscriptionJob, window: torch.Tensor, head: list[int],
                             prior: list[int]) -> tuple[_Decoded, float]:  # fmt: skip
        prompt = ([self.previous, *prior] if prior else []) + head
        decoded, no_speech = None, 0.0
        for attempt, temperature in enumerate(job.temperatures):
            params = self._params(job.params, temperature, len(prompt), job.timestamps)
            if attempt == 0:  # the no-speech probability: <|nospeech|> after <|startoftranscript|> (openai-whisper)
                params = params.replace(prompt_logprobs=NO_SPEECH_TOP)
            tokens, logprobs, at_start = await self._generate(f"{request_id}-t{attempt}", prompt, params, window)
            if attempt == 0:
                no_speech = at_start
            decoded = _Decoded(tokens, logprobs, temperature, compression_ratio(self._text(tokens)))
            repetitive = decoded.compression_ratio > COMPRESSION_RATIO_THRESHOLD
            if not repetitive and decoded.avg_logprob >= LOGPROB_THRESHOLD:
                break
        return decoded, no_speech

    def _params(self, params: GenerationParams, temperature: float, prompt_len: int,
                timestamps: bool) -> GenerationParams:  # fmt: skip
        config = self.config
        rules = WhisperRules(
            begin_index=prompt_len, suppress_tokens=tuple(config.suppress_tokens or ()),
            begin_suppress_tokens=tuple(config.begin_suppress_tokens or ()), timestamps=timestamps,
            no_timestamps_token_id=self.no_timestamps, eos_token_id=self.eos,
            max_initial_timestamp_index=getattr(config, "max_initial_timestamp_index", None),
        )  # fmt: skip
        room = MAX_TEXT_POSITIONS - prompt_len
        sampled = temperature > 0
        return params.replace(
            max_new_tokens=min(params.max_new_tokens, room), whisper=rules, logprobs=params.logprobs or 0,
            do_sample=sampled or params.do_sample, temperature=temperature if sampled else params.temperature,
            num_beams=1 if sampled else params.num_beams, n=1, num_return_sequences=1,
        )  # fmt: skip

    async def _generate(self, request_id: str, prompt: list[int], params: GenerationParams,
                        window: torch.Tensor) -> tuple[list[int], list[float], float]:  # fmt: skip
        """(the window's tokens without end of text, each token's log probability, the no-speech
        probability: ``<|nospeech|>``'s after ``<|startoftranscript|>`` where the prompt's logprobs were
        asked and it is among the ``NO_SPEECH_TOP`` likeliest there, else 0)."""
        tokens: list[int] = []
        logprobs: list[float] = []
        no_speech = 0.0
        after_start = prompt.index(self.sot) + 1
        stream = self.submit(request_id, prompt, params, EncoderInput(features=window))
        try:
            async for output in stream:
                if output.error:
                    raise RuntimeError(output.error)
                if output.prompt_logprobs and len(output.prompt_logprobs) > after_start:
                    top = output.prompt_logprobs[after_start].top
                    no_speech = next((math.exp(t.logprob) for t in top if t.token_id == self.no_speech), 0.0)
                for delta in output.deltas:
                    if delta.index != 0:
                        continue
                    for position, token in enumerate(delta.token_ids):
                        entry = delta.logprobs[position] if delta.logprobs else None
                        logprobs.append(entry.logprob if entry is not None else 0.0)
                        if token != self.eos:
                            tokens.append(token)
        finally:
            await stream.aclose()
        return tokens, logprobs, no_speech

    # ---- word timestamps --------------------------------------------------------------------------------
    async def _word_times(self, pieces: list[WindowSegment], window: torch.Tensor, seek: int, window_frames: int,
                          prefix: list[int], language: str,
                          last_speech: float) -> tuple[dict[int, TimedSegment], float]:  # fmt: skip
        """The window's segments with text (by their index among ``pieces``), timed word by word, and the new
        end of speech: the window's text teacher-forced once more on the worker (after ``prefix``, the
        start of transcript, language and task) for its alignment heads' scores, then openai-whisper's word
        timing (``decoding/text/word_timing.py``)."""
        kept = {i: piece for i, piece in enumerate(pieces) if piece.text.strip() or piece.end > piece.start}
        timed = {i: TimedSegment(piece.start, piece.end, [t for t in piece.tokens if t < self.eos], [])
                 for i, piece in kept.items()}  # fmt: skip
        text_tokens = [token for segment in timed.values() for token in segment.text_tokens]
        if not text_tokens:
            return timed, last_speech
        sequence = [*prefix, self.no_timestamps, *text_tokens, self.eos]
        scores = await self.on_model(lambda model: alignment_scores(model, window, sequence))
        # on the event loop (tens of ms of numpy): the split decodes with this tokenizer, which another thread
        # must not use at the same time
        alignment = align_words(scores, text_tokens, window_frames, self.tokenizer.decode, self.eos, language,
                                len(prefix))  # fmt: skip
        return timed, time_segments(list(timed.values()), alignment, seek * 0.01, last_speech)

    # ---- language and text ------------------------------------------------------------------------------
    async def _language(self, request_id: str, job: TranscriptionJob, mel: np.ndarray) -> str:
        if job.language is not None:
            if job.language not in self.languages:
                raise ParameterError(f"language must be an ISO-639-1 code Whisper knows, got {job.language!r}",
                                     param="language", code="invalid_language")  # fmt: skip
            return job.language
        allowed = set(self.languages.values())
        params = GenerationParams(max_new_tokens=1, suppress_tokens=[t for t in range(len(self.tokenizer))
                                                                     if t not in allowed])  # fmt: skip
        window = torch.from_numpy(np.ascontiguousarray(mel[:, :FRAMES_PER_WINDOW]))
        tokens, _, _ = await self._generate(f"{request_id}-lang", [self.sot], params, window)
        by_id = {i: code for code, i in self.languages.items()}
        return by_id.get(tokens[0], "en") if tokens else "en"

    def _prompt_tokens(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(" " + prompt.strip(), add_special_tokens=False)[-PREVIOUS_TEXT_TOKENS:]

    def _text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode([t for t in tokens if t < self.no_timestamps + 1], skip_special_tokens=True)

    def _token_logprobs(self, tokens: list[int], logprobs: list[float], start: int) -> list[TranscriptToken]:
        out = []
        for offset, token in enumerate(tokens):
            if token > self.no_timestamps:
                continue
            text = self.tokenizer.decode([token])
            out.append(TranscriptToken(text, logprobs[start + offset], list(text.encode("utf-8"))))
        return out


@functools.cache
def _language_names() -> dict[str, str]:
    """Whisper's languages, "en" -> "english" (as OpenAI's verbose_json names them); read when a Whisper model
    is served, not at import: importing Whisper's tokenizer module costs every server start ~0.8 s."""
    from transformers.models.whisper.tokenization_whisper import LANGUAGES

    return LANGUAGES


def whisper_transcriber(model: torch.nn.Module, tokenizer: Any, eos_token_id: int, submit: Callable[..., AsyncIterator],
                        max_seconds: float, on_worker: Callable[[Callable[[], Any]], Future]) -> Transcriber | None:
    """The transcriber of a Whisper model (None for any other): its feature extractor is Whisper's, sized by
    the model's mel bins (80; 128 for large-v3), 16 kHz, 10 ms frames, 30 s windows. ``on_worker`` runs work
    on the worker thread (``Worker.call``): word timestamps' extra pass of the model."""
    if not getattr(model.config, "num_mel_bins", None):
        return None
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)
    return Transcriber(tokenizer, extractor, model.generation_config, eos_token_id, submit,
                       lambda work: asyncio.to_thread(work), max_seconds,
                       lambda work: asyncio.wrap_future(on_worker(lambda: work(model))))  # fmt: skip
