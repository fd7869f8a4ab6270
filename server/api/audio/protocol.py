"""The audio API's body: OpenAI's transcription and translation fields over the generation fields every API shares.

OpenAI's ``response_format`` here is the transcript's format (json, text, srt, vtt, verbose_json), not a
structured-output constraint; ``temperature`` is one number or openai-whisper's fallback list (each in [0, 1]);
its default is 0 (greedy), as OpenAI's. Every HF knob (``num_beams``, ``repetition_penalty``...) is the shared
field it is on the JSON APIs and takes the one translation (``server.translate.params``); a knob Whisper cannot
serve is the engine's 400 naming it. What OpenAI's audio endpoints do not take, or what a transcript cannot
carry, is a 400 naming the field, never silently dropped.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from decoding import GenerationParams, ParameterError
from decoding.params.structured import StructuredOutput
from decoding.transcripts import TranscriptionJob
from server.translate.fields import GenerationFields
from server.translate.params import to_params

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
TIMESTAMPED = ("srt", "vtt", "verbose_json")  # the formats written from timed segments
STREAMED = ("json", "text")  # OpenAI streams only these (transcript.text.delta / .done events)

# OpenAI's fields for its gpt-4o transcription models, which Whisper has no way to honour: each is a 400 saying so
_NOT_SERVED = {
    "keywords": "Whisper takes no keyword list; send the words in prompt, which the first window continues from",
    "languages": "send the one language in language (ISO-639-1), or leave it out to detect it",
    "known_speaker_names": "speaker diarization is not served",
    "known_speaker_references": "speaker diarization is not served",
}
# the shared fields a transcript has no place for
_ONE_TRANSCRIPT = {
    "n": "a transcription is one text",
    "num_return_sequences": "a transcription is one text",
    "stream_options": "the audio API's stream always ends with transcript.text.done and its usage",
    "structured_outputs": "a transcript is free text; constrained decoding is not served on the audio API",
    "return_token_ids": "verbose_json's segments carry their tokens",
}


class TranscriptionRequest(GenerationFields):
    """``POST /v1/audio/transcriptions``'s form (the file apart: ``server.api.audio.form``)."""

    task: ClassVar[str] = "transcribe"
    language: str | None = None
    prompt: str | None = None
    response_format: Literal["json", "text", "srt", "vtt", "verbose_json"] = "json"  # type: ignore[assignment]
    temperature: float | list[float] | None = None  # type: ignore[assignment]
    timestamp_granularities: list[Literal["segment", "word"]] | None = None
    include: list[Literal["logprobs"]] | None = None
    chunking_strategy: str | dict[str, Any] | None = None
    keywords: list[str] | None = None
    languages: list[str] | None = None
    known_speaker_names: list[str] | None = None
    known_speaker_references: list[str] | None = None

    def check(self) -> None:
        """The rules between fields OpenAI states, and what this server cannot serve, each naming its field."""
        for name, why in {**_NOT_SERVED, **_ONE_TRANSCRIPT}.items():
            value = getattr(self, name)
            if value is not None and value != 1 and value is not False:
                raise ParameterError(f"{name} is not served on the audio API: {why}", param=name,
                                     code="unsupported")  # fmt: skip
        self.temperatures()  # each one in [0, 1]
        if self.chunking_strategy is not None and self.chunking_strategy != "auto":
            raise ParameterError('chunking_strategy must be "auto" (Whisper\'s own 30 s windows, each continuing '
                                 "from the last one's text); server_vad is not served", param="chunking_strategy",
                                 code="unsupported")  # fmt: skip
        granularities = self.timestamp_granularities or []
        if granularities and self.response_format != "verbose_json":
            raise ParameterError("timestamp_granularities needs response_format verbose_json, as OpenAI's",
                                 param="timestamp_granularities")  # fmt: skip
        if self.include and self.response_format != "json":
            raise ParameterError("include[]=logprobs works only with response_format json, as OpenAI's",
                                 param="include")  # fmt: skip
        if self.stream and self.response_format not in STREAMED:
            raise ParameterError(f"stream is served with response_format json or text, not {self.response_format} "
                                 "(OpenAI streams only those)", param="stream")  # fmt: skip

    def temperatures(self) -> tuple[float, ...]:
        """The temperatures to decode at, in order (more than one: openai-whisper's fallback); 0 when none given."""
        given = self.temperature
        values = [0.0] if given is None else given if isinstance(given, list) else [given]
        if not values:
            raise ParameterError("temperature: the fallback list is empty", param="temperature")
        for value in values:
            if not 0.0 <= value <= 1.0:
                raise ParameterError(f"temperature must be in [0, 1], got {value}", param="temperature")
        return tuple(float(v) for v in values)

    @property
    def word_timestamps(self) -> bool:
        return "word" in (self.timestamp_granularities or [])

    @property
    def segments_listed(self) -> bool:
        """verbose_json lists segments unless only words were asked for (as OpenAI's)."""
        granularities = self.timestamp_granularities or []
        return not granularities or "segment" in granularities

    @property
    def logprobs(self) -> bool:
        return bool(self.include and "logprobs" in self.include)

    def structured_output(self) -> StructuredOutput | None:
        return None  # response_format is the transcript's format here; structured_outputs is refused in check()

    def params(self, model_defaults: dict[str, Any] | None = None, *, default_max_tokens: int) -> GenerationParams:
        """The one translation, with OpenAI's audio default: temperature 0 (greedy) unless the form samples;
        a fallback list's first temperature is the first try's (the engine sets each later one)."""
        body: GenerationFields = self
        if self.temperature is None and self.do_sample is None:
            body = self.model_copy(update={"temperature": 0.0})
        elif isinstance(self.temperature, list):
            body = self.model_copy(update={"temperature": self.temperatures()[0]})
        return to_params(body, default_max_tokens=default_max_tokens, model_defaults=model_defaults)

    def job(self, audio: bytes, params: GenerationParams) -> TranscriptionJob:
        """What the engine client transcribes: timestamps where the format is written from timed segments."""
        return TranscriptionJob(
            audio=audio, params=params, task=self.task, language=self.language, prompt=self.prompt,
            timestamps=self.response_format in TIMESTAMPED or bool(self.timestamp_granularities),
            temperatures=self.temperatures(), logprobs=self.logprobs, word_timestamps=self.word_timestamps,
        )  # fmt: skip


_TRANSCRIPTION_ONLY = {
    "language": "a translation is always into English and detects the spoken language itself",
    "include": "logprobs are served on transcriptions",
    "timestamp_granularities": "OpenAI's translations endpoint takes no timestamp_granularities; verbose_json's "
    "segments carry their start and end",
}


class TranslationRequest(TranscriptionRequest):
    """``POST /v1/audio/translations``: into English; OpenAI's endpoint takes no ``language``, ``include`` or
    ``timestamp_granularities``."""

    task: ClassVar[str] = "translate"

    def check(self) -> None:
        for name, why in _TRANSCRIPTION_ONLY.items():
            if name in self.model_fields_set:
                raise ParameterError(f"{name} is not a field of /v1/audio/translations: {why}", param=name,
                                     code="unknown_field")  # fmt: skip
        super().check()
