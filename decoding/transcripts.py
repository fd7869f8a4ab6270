"""The speech-to-text contract between the audio API and the engine (torch-free, as the facade is).

The HTTP layer hands the engine client a ``TranscriptionJob`` (the uploaded file's bytes, the task,
language, prompt, whether it wants timestamps, the temperatures to fall back through, and the request's
``GenerationParams`` for every HF knob), and reads back ``TranscriptionUpdate``s: text as it is decoded,
each segment once its window is settled, and a last update with the language, the duration, every
segment and (when asked) every word. How Whisper is driven (windows of 30 s, its prompt tokens, language
detection, the seek from window to window) is the engine client's (``decoding/engine/transcription.py``);
how a transcript is written out (json, text, srt, vtt, verbose_json, OpenAI's stream events) is the API's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from decoding.params import GenerationParams

TASKS = ("transcribe", "translate")


@dataclass
class TranscriptionJob:
    audio: bytes  # the uploaded file as sent (any container/codec the decoder reads)
    params: GenerationParams  # the request's knobs (num_beams, repetition_penalty, ...; max_new_tokens per window)
    task: str = "transcribe"  # or "translate" (into English)
    language: str | None = None  # ISO-639-1 ("en"), or None to detect it from the first window
    prompt: str | None = None  # text the first window continues from (Whisper's previous-text prompt)
    timestamps: bool = False  # segment timestamps wanted (srt, vtt, verbose_json, timestamp_granularities)
    temperatures: tuple[float, ...] = (0.0,)  # more than one: openai-whisper's fallback, in this order
    logprobs: bool = False  # each token's log probability (OpenAI's ``include[]=logprobs``)
    word_timestamps: bool = False  # each word's start and end (``timestamp_granularities[]=word``)


@dataclass
class TranscriptToken:
    token: str
    logprob: float
    bytes: list[int]


@dataclass
class TranscriptWord:
    """One word as OpenAI's ``verbose_json`` lists it (``words``): its text without the space before it."""

    word: str
    start: float  # seconds
    end: float


@dataclass
class TranscriptSegment:
    """One segment as OpenAI's ``verbose_json`` describes it."""

    id: int
    seek: int  # the window's first frame (10 ms each)
    start: float  # seconds
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float


@dataclass
class TranscriptionUpdate:
    text: str = ""  # new transcript text since the last update (a stream's ``transcript.text.delta``)
    segment: TranscriptSegment | None = None  # a segment now settled
    logprobs: list[TranscriptToken] = field(default_factory=list)  # the new text's tokens (when asked)
    done: bool = False  # the last update: the fields below are set
    language: str = ""  # the language transcribed (given or detected), as OpenAI names it ("english")
    duration: float = 0.0  # the audio's seconds
    segments: list[TranscriptSegment] = field(default_factory=list)
    words: list[TranscriptWord] = field(default_factory=list)  # every segment's words (when asked)
    audio_tokens: int = 0  # encoder positions (usage.input_tokens)
    output_tokens: int = 0
