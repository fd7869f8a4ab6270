"""The speech benchmark's parts that need no server: its score, its clips, how the peer is started, its report."""

from __future__ import annotations

import re
import shutil
import wave
from pathlib import Path

import pytest
import yaml

from loadtests import bench_speech, speech_clips
from loadtests.speech_clips import Clip, long_plan, normalise, word_error_rate


def test_the_score_ignores_case_and_punctuation_and_counts_word_edits():
    assert normalise("Hello, World! Don't STOP—now.") == "hello world dont stop now"
    assert word_error_rate(["Hello, world."], ["hello world"]) == 0.0
    # one substitution and one deletion over six reference words, across two clips
    assert word_error_rate(["the cat sat", "on the mat"], ["the dog sat", "on mat"]) == pytest.approx(2 / 6)
    assert word_error_rate(["good morning"], [""]) == 1.0  # a failed request scores as saying nothing
    with pytest.raises(ValueError, match="2 references but 1 transcripts"):
        word_error_rate(["a", "b"], ["a"])


def test_the_sentences_are_twelve_of_different_lengths_with_nothing_whisper_would_spell_its_own_way():
    lengths = [len(s.split()) for s in speech_clips.SENTENCES]
    assert len(lengths) == 12 and len(set(speech_clips.SENTENCES)) == 12
    assert min(lengths) <= 2 and max(lengths) >= 18
    assert not any(re.search(r"\d", s) for s in speech_clips.SENTENCES)


def test_the_long_clip_takes_the_sentences_that_fit_and_spreads_the_rest_as_silence():
    count, gap = long_plan([5.1] * 12, target=49.0)
    assert count == 8  # 8 * 5.1 s + 9 gaps of at least 0.4 s fit 49 s; a ninth sentence would not (49.9 s)
    assert 8 * 5.1 + 9 * gap == pytest.approx(49.0) and gap >= speech_clips.MIN_GAP_S
    with pytest.raises(ValueError, match="cannot fill 49 s"):
        long_plan([1.0] * 3, target=49.0)  # only silence would be left to measure


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed (Debian's espeak-ng)")
def test_clips_are_16_khz_mono_wav_and_the_long_one_is_49_seconds(tmp_path):
    clips, long = speech_clips.make_clips(tmp_path)
    assert [c.text for c in clips] == list(speech_clips.SENTENCES)
    for clip in [*clips, long]:
        with wave.open(str(clip.path)) as audio:
            assert (audio.getframerate(), audio.getnchannels(), audio.getsampwidth()) == (16000, 1, 2)
            assert audio.getnframes() / 16000 == pytest.approx(clip.seconds)
    assert long.seconds == pytest.approx(49.0, abs=0.01) and len(long.text.split()) > 100


def test_the_peer_is_skipped_with_a_reason_without_an_interpreter(monkeypatch, tmp_path):
    monkeypatch.delenv(bench_speech.FWS_ENV, raising=False)
    args = bench_speech.build_parser().parse_args(["--threads", "3"])
    found = bench_speech.servers(args, tmp_path)
    decoda = found[bench_speech.DECODA]
    assert decoda.command[decoda.command.index("--num-threads") + 1] == "3" and decoda.beams == {"num_beams": 5}
    for compute_type in ("float32", "int8"):
        reason = found[f"{bench_speech.FWS} {compute_type}"]
        assert reason.startswith("skipped") and "--fws-python" in reason and bench_speech.FWS_ENV in reason
    assert "/work/" not in Path(bench_speech.__file__).read_text()


def test_the_peer_serves_the_same_folder_on_the_cpu_greedy_and_with_five_beams(monkeypatch, tmp_path):
    python = tmp_path / "python"
    python.write_text("")
    monkeypatch.setenv(bench_speech.FWS_ENV, str(python))
    args = bench_speech.build_parser().parse_args(["--threads", "2", "--fws-compute-types", "float32"])
    args.ct2_folder = lambda: tmp_path / "ct2 folder"
    peer = bench_speech.servers(args, tmp_path)[f"{bench_speech.FWS} float32"]
    assert peer.command[:3] == [str(python), "-m", "faster_whisper_server"]
    config = yaml.safe_load(Path(peer.command[peer.command.index("--config") + 1]).read_text())
    models = {m["name"]: m for m in config["models"]}
    assert {m["path"] for m in models.values()} == {str(tmp_path / "ct2 folder")}
    assert all(m["model_options"] == {"device": "cpu", "compute_type": "float32", "cpu_threads": 2}
               for m in models.values())  # fmt: skip
    assert models["greedy"]["transcribe_options"] == {"beam_size": 1}  # faster-whisper's default is 5
    assert models["beam5"]["transcribe_options"] == {"beam_size": 5}
    assert (peer.greedy, peer.beams) == ({"model_name": "greedy"}, {"model_name": "beam5"})


def row(server: str, round_: int, clips_s: float, beams: float, wer: float) -> dict:
    return {"server": server, "round": round_, "wer_greedy": wer, "wer_beam": wer, "clips_s_1": clips_s,
            "clips_s_8": clips_s * 2, "rtf_long": 0.25, "beam_over_greedy": beams,
            "streamed_beam_over_greedy": beams + 0.5, "wer_long": 0.1, "failed": 0, "ready_s": 3.0,
            "resident_mb": 500.0}  # fmt: skip


def test_the_report_states_each_goal_from_ratios_within_rounds_and_lists_what_did_not_run(tmp_path):
    peer = f"{bench_speech.FWS} float32"
    rows = [row(bench_speech.DECODA, 1, 1.0, 1.5, 0.05), row(peer, 1, 2.0, 3.0, 0.02),
            row(bench_speech.DECODA, 2, 3.0, 2.5, 0.05), row(peer, 2, 3.0, 3.0, 0.02)]  # fmt: skip
    args = bench_speech.build_parser().parse_args(["--rounds", "2", "--threads", "2"])
    clip = Clip(tmp_path / "a.wav", "good morning", 1.0)
    path = bench_speech.write_markdown(rows, {f"{bench_speech.FWS} int8": "exited with 1"}, "bench --rounds 2",
                                       args, [0.5, 1.5], [clip], Clip(tmp_path / "l.wav", "x", 49.0),
                                       tmp_path / "speech.md")  # fmt: skip
    text = path.read_text()
    assert (
        "`bench --rounds 2`" in text
        and "0.50 before the first server started; 1.50 to 1.50 during the run" in text
        and "2 round(s)" in text
    )
    assert "Decoda 0.050, peer 0.020 (difference +0.030; goal: at most 0.02 above: not met)" in text
    assert "clips/s at 1 client: **0.75x** the peer's (0.50x, 1.00x; goal >= 0.8x: not met)" in text
    assert "clips/s at 8 clients: **0.75x**" in text
    assert "5 beams over greedy, time per clip: **2.00x** (1.50x, 2.50x; goal <= 2x: met)" in text
    assert "5 beams over greedy streamed, time per clip: **2.50x** (2.00x, 3.00x; goal <= 2x: not met)" in text
    assert "| decoda | 0.050 (0.050, 0.050) | 0.050 (0.050, 0.050) | 2.00 (1.00, 3.00) |" in text
    assert f"| {bench_speech.FWS} int8 | exited with 1 |" in text
