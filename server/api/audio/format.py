"""A transcript written out as OpenAI's audio API writes it: json, text, srt, vtt, verbose_json, or stream events.

Shapes follow the ``openai`` client's types (``openai.types.audio``): ``Transcription`` (text, usage by
duration, ``logprobs`` when ``include[]=logprobs``), ``TranscriptionVerbose`` (task, language, duration,
text, segments as ``TranscriptionSegment``, words as ``TranscriptionWord``), and the stream's
``TranscriptionTextDeltaEvent`` per piece of text and one ``TranscriptionTextDoneEvent`` with the whole text
and the usage in tokens (the encoder's positions in, the decoded tokens out). The transcript's text is its
segments' text with the leading space Whisper writes before a segment's first word dropped, as OpenAI's;
srt and vtt number and time each segment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import JSONResponse, PlainTextResponse, Response

from decoding.transcripts import TranscriptionUpdate, TranscriptSegment, TranscriptToken
from server.http.errors import from_exception
from server.output.streaming import event


@dataclass
class Transcript:
    """Every update of one transcription, gathered."""

    text: str = ""
    logprobs: list[TranscriptToken] = field(default_factory=list)
    last: TranscriptionUpdate | None = None  # the ``done`` update (language, duration, segments, counts)

    def add(self, update: TranscriptionUpdate) -> None:
        self.text += update.text
        self.logprobs.extend(update.logprobs)
        if update.done:
            self.last = update

    @property
    def done(self) -> TranscriptionUpdate:
        if self.last is None:
            raise RuntimeError("the engine's transcription ended without its last (done) update")
        return self.last


async def collected(first: TranscriptionUpdate, rest: AsyncIterator[TranscriptionUpdate]) -> Transcript:
    transcript = Transcript()
    transcript.add(first)
    async for update in rest:
        transcript.add(update)
    return transcript


def duration_usage(done: TranscriptionUpdate) -> dict[str, Any]:
    return {"type": "duration", "seconds": done.duration}


def token_usage(done: TranscriptionUpdate) -> dict[str, Any]:
    return {"type": "tokens", "input_tokens": done.audio_tokens, "output_tokens": done.output_tokens,
            "total_tokens": done.audio_tokens + done.output_tokens,
            "input_token_details": {"audio_tokens": done.audio_tokens, "text_tokens": 0}}  # fmt: skip


def logprobs_of(tokens: list[TranscriptToken]) -> list[dict[str, Any]]:
    return [{"token": t.token, "logprob": t.logprob, "bytes": list(t.bytes)} for t in tokens]


def segment_body(segment: TranscriptSegment) -> dict[str, Any]:
    return dataclasses.asdict(segment)


def body(transcript: Transcript, response_format: str, task: str, logprobs: bool, segments: bool = True,
         words: bool = False) -> Response:  # fmt: skip
    """The whole answer in ``response_format``; verbose_json lists the ``words`` where they were asked for, and
    the ``segments`` unless only the words were."""
    done = transcript.done
    text = transcript.text.strip()
    if response_format == "json":
        payload: dict[str, Any] = {"text": text, "usage": duration_usage(done)}
        if logprobs:
            payload["logprobs"] = logprobs_of(transcript.logprobs)
        return JSONResponse(payload)
    if response_format == "verbose_json":
        verbose: dict[str, Any] = {"task": task, "language": done.language, "duration": done.duration, "text": text}
        if words:
            verbose["words"] = [dataclasses.asdict(word) for word in done.words]
        if segments:
            verbose["segments"] = [segment_body(s) for s in done.segments]
        return JSONResponse({**verbose, "usage": duration_usage(done)})
    if response_format == "srt":
        return PlainTextResponse(srt(done.segments))
    if response_format == "vtt":
        return PlainTextResponse(vtt(done.segments))
    return PlainTextResponse(text + "\n")


def timestamp(seconds: float, decimal: str) -> str:
    """``HH:MM:SS,mmm`` (srt) or ``HH:MM:SS.mmm`` (vtt)."""
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{millis:03d}"


def srt(segments: list[TranscriptSegment]) -> str:
    cues = [f"{i}\n{timestamp(s.start, ',')} --> {timestamp(s.end, ',')}\n{s.text.strip()}\n"
            for i, s in enumerate(segments, start=1)]  # fmt: skip
    return "\n".join(cues)


def vtt(segments: list[TranscriptSegment]) -> str:
    cues = [f"{timestamp(s.start, '.')} --> {timestamp(s.end, '.')}\n{s.text.strip()}\n" for s in segments]
    return "\n".join(["WEBVTT\n", *cues])


async def stream_events(
    first: TranscriptionUpdate, rest: AsyncIterator[TranscriptionUpdate], logprobs: bool, request_id: str
) -> AsyncIterator[dict]:
    """OpenAI's stream: a ``transcript.text.delta`` per update with text, then ``transcript.text.done``; an
    error half-way is OpenAI's error object as the last event. Closing this (the client went away) closes
    ``rest``, which aborts the transcription in the engine."""
    transcript = Transcript()
    try:
        update: TranscriptionUpdate | None = first
        while update is not None:
            delta = update.text if transcript.text.strip() else update.text.lstrip()
            transcript.add(update)
            if delta:
                payload: dict[str, Any] = {"type": "transcript.text.delta", "delta": delta}
                if logprobs:
                    payload["logprobs"] = logprobs_of(update.logprobs)
                yield event(payload)
            update = await anext(rest, None)
        done: dict[str, Any] = {"type": "transcript.text.done", "text": transcript.text.strip(),
                                "usage": token_usage(transcript.done)}  # fmt: skip
        if logprobs:
            done["logprobs"] = logprobs_of(transcript.logprobs)
        yield event(done)
    except Exception as exc:  # noqa: BLE001 (the stream has begun: the error is its last event)
        yield event(from_exception(exc, request_id).body())
    finally:
        await closed(rest)


async def closed(updates: AsyncIterator[TranscriptionUpdate]) -> None:
    """Close the engine's iterator (an async generator, or a stream with ``aclose``): the engine aborts a
    transcription whose iterator is closed before its last update."""
    close = getattr(updates, "aclose", None)
    if close is not None:
        await close()
