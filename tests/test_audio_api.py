"""OpenAI's audio API (/v1/audio/transcriptions, /v1/audio/translations) against a fake speech engine.

The real ``openai`` client reaches the app in process wherever it can send the request; httpx's multipart
sends what the client would refuse to (an empty file, a field OpenAI's translations endpoint does not take).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.audio import TranscriptionTextDeltaEvent, TranscriptionTextDoneEvent

from decoding import ModelFacts, QueueFullError, ServedModel
from decoding.transcripts import (
    TranscriptionJob,
    TranscriptionUpdate,
    TranscriptSegment,
    TranscriptToken,
    TranscriptWord,
)
from server.app import create_app
from server.config.settings import Settings
from tests.asgi_driver import stream_then_hang_up
from tests.fake_engine import FakeEngineClient
from tests.test_api import error_of, run

MODEL = "fake-model"
AUDIO = b"RIFF" + bytes(2000)  # what the fake engine is given; it reads none of it
SEGMENTS = [
    TranscriptSegment(id=0, seek=0, start=0.0, end=1.5, text=" Hello world.", tokens=[50364, 2425, 1002],
                      temperature=0.0, avg_logprob=-0.25, compression_ratio=1.1, no_speech_prob=0.01),
    TranscriptSegment(id=1, seek=0, start=1.5, end=3725.25, text=" Goodbye.", tokens=[14518, 13],
                      temperature=0.0, avg_logprob=-0.3, compression_ratio=1.0, no_speech_prob=0.02),
]  # fmt: skip
WORDS = [TranscriptWord("Hello", 0.0, 0.62), TranscriptWord("world.", 0.62, 1.5), TranscriptWord("Goodbye.", 1.5, 2.1)]


def tokens_of(segment: TranscriptSegment) -> list[TranscriptToken]:
    words = segment.text.split(" ")[1:]
    return [TranscriptToken(token=" " + w, logprob=-0.1 * (i + 1), bytes=list((" " + w).encode()))
            for i, w in enumerate(words)]  # fmt: skip


class SpeechEngine(FakeEngineClient):
    """A Whisper-like fake: ``transcribe`` yields one update per scripted segment, then the last one."""

    facts = ModelFacts(vocab_size=51865, max_model_len=448, num_layers=4, encoder_decoder=True,  # type: ignore[assignment]
                       input_kind="audio")  # fmt: skip

    def __init__(self, **kwargs: Any) -> None:  # noqa: ANN401
        super().__init__(**kwargs)
        self.jobs: list[tuple[str, TranscriptionJob]] = []
        self.closed: list[str] = []  # transcriptions whose iterator was closed before its last update

    def served_models(self) -> list[ServedModel]:
        return [ServedModel(self.model_name, "target", 448, task="automatic-speech-recognition")]

    def transcribe(self, request_id: str, job: TranscriptionJob) -> AsyncIterator[TranscriptionUpdate]:
        if self.queue_full:
            raise QueueFullError("the waiting queue is full", retry_after=3)
        self.jobs.append((request_id, job))
        return self._updates(request_id, job)

    async def _updates(self, request_id: str, job: TranscriptionJob) -> AsyncIterator[TranscriptionUpdate]:
        finished = False
        try:
            for segment in SEGMENTS:
                await asyncio.sleep(self.delay)
                yield TranscriptionUpdate(text=segment.text, segment=segment,
                                          logprobs=tokens_of(segment) if job.logprobs else [])  # fmt: skip
            finished = True
            yield TranscriptionUpdate(done=True, language="english", duration=3725.25, segments=list(SEGMENTS),
                                      words=list(WORDS) if job.word_timestamps else [], audio_tokens=1500,
                                      output_tokens=7)  # fmt: skip
        finally:
            if not finished:
                self.closed.append(request_id)


def app_of(engine: FakeEngineClient, **settings: Any) -> Any:  # noqa: ANN401
    return create_app(Settings(**settings), engine_client=engine)


def openai_client(app: Any) -> openai.AsyncOpenAI:  # noqa: ANN401
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", max_retries=0, http_client=http)


def transcribe(engine: FakeEngineClient, **kwargs: Any) -> Any:  # noqa: ANN401
    """``client.audio.transcriptions.create`` through the real openai client."""

    async def go() -> Any:  # noqa: ANN401
        return await openai_client(app_of(engine)).audio.transcriptions.create(
            file=("clip.wav", AUDIO, "audio/wav"), model=MODEL, **kwargs
        )

    return run(go())


def post_form(engine: FakeEngineClient, data: dict, path: str = "/v1/audio/transcriptions",
              audio: bytes = AUDIO, **settings: Any) -> httpx.Response:  # noqa: ANN401  # fmt: skip
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app_of(engine, **settings))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            return await http.post(path, data=data, files={"file": ("clip.wav", audio, "audio/wav")})

    return run(go())


def refused(response: httpx.Response, param: str, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    error = error_of(response)
    assert error["param"] == param, error
    return error


# ---- every response_format -----------------------------------------------------------------------------
def test_json_is_openais_transcription_with_duration_usage_and_the_job_is_greedy_without_timestamps():
    engine = SpeechEngine()
    result = transcribe(engine)
    assert result.text == "Hello world. Goodbye."
    assert result.usage.type == "duration" and result.usage.seconds == 3725.25
    assert result.logprobs is None
    ((request_id, job),) = engine.jobs
    assert job.audio == AUDIO and job.task == "transcribe" and job.language is None and job.prompt is None
    assert not job.timestamps and not job.logprobs and job.temperatures == (0.0,)
    assert not job.params.do_sample and job.params.num_beams == 1
    assert job.params.max_new_tokens == 448  # the decoder's context: the engine cuts it to each window's room
    assert request_id.startswith("transcribe-")


def test_verbose_json_is_openais_transcription_verbose_with_every_segment_field():
    engine = SpeechEngine()
    result = transcribe(engine, response_format="verbose_json", timestamp_granularities=["segment"],
                        language="en", prompt="123")  # fmt: skip
    assert result.language == "english" and result.duration == 3725.25 and result.text == "Hello world. Goodbye."
    assert [s.model_dump() for s in result.segments] == [
        {"id": s.id, "seek": s.seek, "start": s.start, "end": s.end, "text": s.text, "tokens": s.tokens,
         "temperature": s.temperature, "avg_logprob": s.avg_logprob, "compression_ratio": s.compression_ratio,
         "no_speech_prob": s.no_speech_prob} for s in SEGMENTS
    ]  # fmt: skip
    assert result.model_extra["task"] == "transcribe" and result.usage.seconds == 3725.25
    job = engine.jobs[0][1]
    assert job.timestamps and job.language == "en" and job.prompt == "123"  # a number-looking prompt stays text


@pytest.mark.parametrize("granularities", [["word"], ["word", "segment"], ["segment", "word"]])
def test_word_granularity_lists_openais_words_and_the_segments_only_when_asked_too(granularities):
    engine = SpeechEngine()
    result = transcribe(engine, response_format="verbose_json", timestamp_granularities=granularities)
    assert [w.model_dump() for w in result.words] == [{"word": w.word, "start": w.start, "end": w.end} for w in WORDS]
    assert (result.segments is not None) == ("segment" in granularities)  # OpenAI's: words alone, unless both
    job = engine.jobs[0][1]
    assert job.word_timestamps and job.timestamps
    plain = SpeechEngine()
    assert transcribe(plain, response_format="verbose_json").words is None  # no words unless asked
    assert not plain.jobs[0][1].word_timestamps


def test_text_srt_and_vtt_are_plain_text_in_their_standard_timestamps():
    engine = SpeechEngine()
    assert transcribe(engine, response_format="text") == "Hello world. Goodbye.\n"
    assert transcribe(engine, response_format="srt") == (
        "1\n00:00:00,000 --> 00:00:01,500\nHello world.\n\n2\n00:00:01,500 --> 01:02:05,250\nGoodbye.\n"
    )
    assert transcribe(engine, response_format="vtt") == (
        "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello world.\n\n00:00:01.500 --> 01:02:05.250\nGoodbye.\n"
    )
    assert [job.timestamps for _, job in engine.jobs] == [False, True, True]
    response = post_form(engine, {"response_format": "srt"})
    assert response.headers["content-type"].startswith("text/plain")


def test_json_with_include_logprobs_carries_each_tokens_logprob_and_bytes():
    engine = SpeechEngine()
    result = transcribe(engine, include=["logprobs"])
    expected = [t for s in SEGMENTS for t in tokens_of(s)]
    assert [(p.token, p.logprob, p.bytes) for p in result.logprobs] == [(t.token, t.logprob, t.bytes) for t in expected]
    assert engine.jobs[0][1].logprobs


def test_translations_go_through_the_openai_client_as_the_translate_task():
    engine = SpeechEngine()

    async def go() -> Any:  # noqa: ANN401
        client = openai_client(app_of(engine))
        plain = await client.audio.translations.create(file=("clip.mp3", AUDIO), model=MODEL)
        verbose = await client.audio.translations.create(file=("clip.mp3", AUDIO), model=MODEL,
                                                         response_format="verbose_json")  # fmt: skip
        return plain, verbose

    plain, verbose = run(go())
    assert plain.text == "Hello world. Goodbye." and verbose.segments[1].text == " Goodbye."
    assert [job.task for _, job in engine.jobs] == ["translate", "translate"]
    assert engine.jobs[0][0].startswith("translate-")


# ---- streaming ----------------------------------------------------------------------------------------
def test_stream_is_openais_delta_events_then_done_as_the_openai_client_parses_them():
    engine = SpeechEngine()

    async def go() -> list:
        client = openai_client(app_of(engine))
        stream = await client.audio.transcriptions.create(file=("clip.wav", AUDIO), model=MODEL, stream=True,
                                                          include=["logprobs"])  # fmt: skip
        return [event async for event in stream]

    events = run(go())
    *deltas, done = events
    assert all(isinstance(e, TranscriptionTextDeltaEvent) for e in deltas) and len(deltas) == 2
    assert "".join(e.delta for e in deltas) == "Hello world. Goodbye."
    assert [[p.token for p in e.logprobs] for e in deltas] == [[" Hello", " world."], [" Goodbye."]]
    assert isinstance(done, TranscriptionTextDoneEvent) and done.text == "Hello world. Goodbye."
    assert (done.usage.input_tokens, done.usage.output_tokens, done.usage.total_tokens) == (1500, 7, 1507)
    assert len(done.logprobs) == 3


def test_a_text_stream_without_include_has_no_logprobs():
    response = post_form(SpeechEngine(), {"stream": "true", "response_format": "text"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    payloads = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
    assert [p["type"] for p in payloads] == ["transcript.text.delta", "transcript.text.delta", "transcript.text.done"]
    assert all("logprobs" not in p for p in payloads)


def test_a_client_that_hangs_up_mid_stream_closes_the_transcription():
    engine = SpeechEngine(delay=0.2)
    request = httpx.Request("POST", "http://test/v1/audio/transcriptions", data={"stream": "true"},
                            files={"file": ("clip.wav", AUDIO)})  # fmt: skip
    headers = [(k.lower().encode(), v.encode()) for k, v in request.headers.items()]
    chunks = run(stream_then_hang_up(app_of(engine), "/v1/audio/transcriptions", request.read(), headers=headers))
    assert b"transcript.text.delta" in chunks[0]
    assert len(chunks) == 1 and len(engine.jobs) == 1
    assert engine.closed == [engine.jobs[0][0]]  # closed before its last update: the engine aborts it


# ---- knobs as form fields -----------------------------------------------------------------------------
def test_hf_knobs_as_form_fields_reach_generation_params():
    engine = SpeechEngine()
    transcribe(engine, extra_body={"num_beams": 5, "repetition_penalty": 1.2, "length_penalty": 0.5,
                                   "no_repeat_ngram_size": 3, "max_new_tokens": 40, "seed": 7,
                                   "suppress_tokens": [11, 13], "early_stopping": True})  # fmt: skip
    params = engine.jobs[0][1].params
    assert (params.num_beams, params.repetition_penalty, params.length_penalty) == (5, 1.2, 0.5)
    assert (params.no_repeat_ngram_size, params.max_new_tokens, params.seed) == (3, 40, 7)
    assert params.suppress_tokens == [11, 13] and params.early_stopping is True


def test_sampling_knobs_follow_the_temperature_and_a_greedy_request_refuses_them():
    engine = SpeechEngine()
    transcribe(engine, temperature=0.6, extra_body={"top_k": 20, "top_p": 0.9})
    params = engine.jobs[0][1].params
    assert params.do_sample and params.temperature == 0.6 and params.top_k == 20 and params.top_p == 0.9
    assert engine.jobs[0][1].temperatures == (0.6,)
    refused(post_form(SpeechEngine(), {"top_k": "20"}), "top_k")  # greedy by default, as OpenAI's 0


@pytest.mark.parametrize("data", [
    {"temperature": ["0", "0.2", "0.4"]},  # the field repeated
    {"temperature": "[0, 0.2, 0.4]"},  # one JSON list
    {"temperature[]": ["0", "0.2", "0.4"]},  # as the openai client sends extra_body's lists
])  # fmt: skip
def test_a_temperature_list_is_openai_whispers_fallback(data):
    engine = SpeechEngine()
    assert post_form(engine, data).status_code == 200
    job = engine.jobs[0][1]
    assert job.temperatures == (0.0, 0.2, 0.4) and not job.params.do_sample  # the first try is greedy


def test_a_multipart_upload_larger_than_a_json_body_passes_on_the_audio_routes():
    engine = SpeechEngine()
    big = bytes(5 * 1024 * 1024)  # over the default --max-request-bytes (4 MiB), under --max-audio-bytes
    assert post_form(engine, {}, audio=big).status_code == 200 and engine.jobs[0][1].audio == big
    assert post_form(engine, {}, path="/v1/audio/translations", audio=big).status_code == 200


# ---- refusals, each naming its field ----------------------------------------------------------------------
def test_an_empty_or_missing_file_is_a_400_naming_file():
    assert "empty" in refused(post_form(SpeechEngine(), {}, audio=b""), "file")["message"]

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app_of(SpeechEngine())),
                                     base_url="http://test") as http:  # fmt: skip
            return await http.post("/v1/audio/transcriptions", data={"model": MODEL},
                                   files={"other": ("x.wav", AUDIO)})  # fmt: skip

    refused(run(go()), "other")
    refused(post_form(SpeechEngine(), {"file": "not a file"}, audio=AUDIO), "file")


def test_a_file_over_max_audio_bytes_is_a_413_naming_file():
    # within the body's allowance (the file's limit plus --max-request-bytes): the route measures the file
    error = refused(post_form(SpeechEngine(), {}, audio=bytes(1001), max_audio_bytes=1000), "file", 413)
    assert "1001 bytes" in error["message"] and "--max-audio-bytes" in error["message"]
    # past the allowance: refused from its Content-Length before any of it is read
    engine = SpeechEngine()
    error = refused(post_form(engine, {}, audio=bytes(10_000), max_audio_bytes=1000, max_request_bytes=4096),
                    "file", 413)  # fmt: skip
    assert "--max-audio-bytes" in error["message"] and engine.jobs == []
    # the default is OpenAI's 25 MB
    assert Settings().max_audio_bytes == 25_000_000


@pytest.mark.parametrize(("data", "param", "words"), [
    ({"timestamp_granularities[]": "word"}, "timestamp_granularities", "verbose_json"),
    ({"timestamp_granularities[]": "segment"}, "timestamp_granularities", "verbose_json"),
    ({"include[]": "logprobs", "response_format": "verbose_json"}, "include", "json"),
    ({"stream": "true", "response_format": "srt"}, "stream", "srt"),
    ({"num_beam": "5"}, "num_beam", "num_beam"),
    ({"temperature": "2"}, "temperature", "[0, 1], got 2"),
    ({"temperature": "[0, 0.5, 1.5]"}, "temperature", "got 1.5"),
    ({"response_format": "diarized_json"}, "response_format", ""),
    ({"chunking_strategy[type]": "server_vad"}, "chunking_strategy", "auto"),
    ({"n": "2"}, "n", "one text"),
    ({"keywords[]": "Decoda"}, "keywords", "prompt"),
    ({"stream": "maybe"}, "stream", ""),
])  # fmt: skip
def test_each_refusal_names_its_field(data, param, words):
    engine = SpeechEngine()
    error = refused(post_form(engine, data), param)
    assert words in error["message"] and engine.jobs == []


@pytest.mark.parametrize(
    "data",
    [
        {"language": "de"},
        {"include[]": "logprobs"},
        {"timestamp_granularities[]": "segment", "response_format": "verbose_json"},
    ],
)
def test_translations_refuse_the_fields_openais_translations_endpoint_does_not_take(data):
    (name,) = [key.removesuffix("[]") for key in data if key != "response_format"]
    refused(post_form(SpeechEngine(), data, path="/v1/audio/translations"), name)


def test_chunking_strategy_auto_is_accepted():
    engine = SpeechEngine()
    assert transcribe(engine, chunking_strategy="auto").text == "Hello world. Goodbye."


def test_a_model_that_does_not_take_audio_is_a_400_naming_model():
    error = refused(post_form(FakeEngineClient(), {"model": MODEL}), "model")
    assert "does not transcribe speech" in error["message"]
    refused(post_form(SpeechEngine(), {"model": "whisper-9"}), "model", 404)


def test_a_full_queue_is_a_429_with_retry_after():
    response = post_form(SpeechEngine(queue_full=True), {})
    refused(response, None, 429)
    assert response.headers["retry-after"] == "3"


def test_both_routes_are_in_openapi_with_a_multipart_body():
    async def go() -> dict:
        transport = httpx.ASGITransport(app=app_of(SpeechEngine()))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            return (await http.get("/openapi.json")).json()

    doc = run(go())
    for path in ("/v1/audio/transcriptions", "/v1/audio/translations"):
        operation = doc["paths"][path]["post"]
        schema = operation["requestBody"]["content"]["multipart/form-data"]["schema"]
        assert schema["required"] == ["file"] and schema["properties"]["file"]["format"] == "binary"
        assert {"400", "413", "429", "503"} <= set(operation["responses"])
        assert ("language" in schema["properties"]) == path.endswith("transcriptions")


def test_a_chunked_upload_over_the_allowance_is_a_413_naming_file_as_it_arrives():
    request = httpx.Request("POST", "http://test/v1/audio/transcriptions", files={"file": ("clip.wav", bytes(20_000))})
    payload = request.read()

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the server counts what arrives
        for i in range(0, len(payload), 1000):
            yield payload[i : i + 1000]

    async def go() -> httpx.Response:
        app = app_of(SpeechEngine(), max_audio_bytes=1000, max_request_bytes=4096)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            headers = {"content-type": request.headers["content-type"]}
            return await http.post("/v1/audio/transcriptions", content=chunks(), headers=headers)

    assert "--max-audio-bytes" in refused(run(go()), "file", 413)["message"]
