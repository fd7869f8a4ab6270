"""``POST /v1/audio/transcriptions`` and ``POST /v1/audio/translations``: a multipart upload to a transcript.

The form is read with its file bounded (``--max-audio-bytes``), checked as a body of its API
(``protocol``), translated by the one path every generation API takes (``server.api.generation``), and
handed to the engine client as a ``TranscriptionJob``. The first update is awaited before answering, so a
file that is not audio, a model that does not take audio or a full queue is an error status, not a stream
that fails; a client that goes away closes the engine's iterator, which aborts the transcription.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError
from sse_starlette.sse import EventSourceResponse

from decoding import EngineClient, ParameterError
from server.api.audio.form import read_form
from server.api.audio.format import body as transcript_body
from server.api.audio.format import closed, collected, stream_events
from server.api.audio.protocol import RESPONSE_FORMATS, TranscriptionRequest, TranslationRequest
from server.api.generation import engine_of, engine_rows, served_model, translated
from server.http.auth import require_api_key
from server.http.limits import UploadLimit, caller_hold
from server.output.streaming import until_disconnect

TRANSCRIPTIONS, TRANSLATIONS = "/v1/audio/transcriptions", "/v1/audio/translations"
UPLOADS = {TRANSCRIPTIONS: ("file", "max_audio_bytes"), TRANSLATIONS: ("file", "max_audio_bytes")}

router = APIRouter(dependencies=[Depends(require_api_key)])


def _form_schema(translation: bool) -> dict[str, Any]:
    """``/openapi.json``'s request body: OpenAI's form fields; every GenerationConfig knob is a form field too."""
    props: dict[str, Any] = {
        "file": {"type": "string", "format": "binary", "description": "the audio (flac, mp3, mp4, m4a, ogg, wav, "
                 "webm...), at most --max-audio-bytes"},
        "model": {"type": "string"},
        "prompt": {"type": "string", "description": "text the first window continues from"},
        "response_format": {"type": "string", "enum": list(RESPONSE_FORMATS), "default": "json"},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1, "default": 0,
                        "description": "0: greedy; a repeated field or a JSON list: openai-whisper's fallback"},
        "stream": {"type": "boolean", "default": False, "description": "server-sent events (json and text only)"},
        "chunking_strategy": {"type": "string", "enum": ["auto"]},
    }  # fmt: skip
    if not translation:
        props["language"] = {"type": "string", "description": "ISO-639-1; detected when left out"}
        granularity = {"type": "string", "enum": ["segment", "word"]}
        props["timestamp_granularities[]"] = {"type": "array", "items": granularity,
                                              "description": "needs verbose_json; word: each word's start and "
                                                             "end (an extra pass of the model per window)"}  # fmt: skip
        props["include[]"] = {"type": "array", "items": {"type": "string", "enum": ["logprobs"]},
                              "description": "needs response_format json"}  # fmt: skip
    schema = {"type": "object", "required": ["file"], "properties": props, "additionalProperties": True,
              "description": "every transformers GenerationConfig knob (num_beams, repetition_penalty, top_k, "
                             "seed, max_new_tokens...) is accepted as a form field by its HF name"}  # fmt: skip
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}}


_OK = {200: {"description": "The transcript: JSON (json, verbose_json), text (text, srt, vtt), or with "
             "`stream: true` server-sent events (transcript.text.delta, then transcript.text.done)",
             "content": {"application/json": {}, "text/plain": {"schema": {"type": "string"}},
                         "text/event-stream": {"schema": {"type": "string"}}}}}  # fmt: skip


@router.post(TRANSCRIPTIONS, openapi_extra=_form_schema(translation=False), responses=_OK)
async def transcriptions(request: Request) -> Response:
    return await _transcribe(request, TranscriptionRequest, TRANSCRIPTIONS)


@router.post(TRANSLATIONS, openapi_extra=_form_schema(translation=True), responses=_OK)
async def translations(request: Request) -> Response:
    return await _transcribe(request, TranslationRequest, TRANSLATIONS)


def _validated(kind: type[TranscriptionRequest], fields: dict[str, Any]) -> TranscriptionRequest:
    """The form as its body; a wrong or unknown field is the 400 naming it that a JSON body gets."""
    try:
        body = kind.model_validate(fields)
    except ValidationError as exc:
        errors = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]
        raise RequestValidationError(errors) from None
    body.check()
    return body


def _takes_audio(client: EngineClient, model: str) -> None:
    if client.facts.input_kind != "audio":
        task = next((m.task for m in client.served_models() if m.name == client.model_name), "text-generation")
        raise ParameterError(f"model '{model}' does not transcribe speech (it serves {task}); the audio API needs "
                             "a speech model such as whisper-base", param="model",
                             code="model_not_supported")  # fmt: skip


async def _transcribe(request: Request, kind: type[TranscriptionRequest], path: str) -> Response:
    client = engine_of(request)
    limit = UploadLimit.of(request.app.state.settings, *UPLOADS[path])  # the limits middleware's too
    fields, audio = await read_form(request, kind, limit)
    body = _validated(kind, fields)
    model = served_model(client, body.model)
    _takes_audio(client, model)
    body, params = translated(request, client, body, default_max_tokens=client.max_model_len)
    hold = caller_hold(request.scope.get("state", {}))
    if hold is not None:  # the caller's limit counts the rows each window runs
        hold.grow(engine_rows(params), "num_beams" if params.num_beams > 1 else "file")
    request_id = f"{body.task}-{uuid.uuid4().hex}"
    updates = client.transcribe(request_id, body.job(audio, params))
    try:
        first = await until_disconnect(request, anext(updates))
    except BaseException:
        await closed(updates)
        raise
    if body.stream:
        return EventSourceResponse(stream_events(first, updates, body.logprobs, request_id), ping=15)
    try:
        transcript = await until_disconnect(request, collected(first, updates))
    finally:
        await closed(updates)
    return transcript_body(transcript, body.response_format, body.task, body.logprobs, body.segments_listed,
                           body.word_timestamps)  # fmt: skip
