"""A window's tokens read into segments and the next window's start, as openai-whisper's transcribe()
reads them (decoding/text/whisper_windows.py), on hand-made token sequences."""

from __future__ import annotations

import pytest

from decoding.text.whisper_windows import compression_ratio, window_segments

TB = 1000  # the first timestamp token: <|0.00|>


def ts(seconds: float) -> int:
    return TB + round(seconds / 0.02)


def text_of(tokens: list[int]) -> str:
    return " ".join(f"w{t}" for t in tokens if t < TB)


def test_closed_pairs_are_segments_and_the_next_window_starts_at_the_last_timestamp():
    tokens = [ts(0.0), 1, 2, ts(2.0), ts(2.5), 3, ts(4.0)]  # ends on a pair? no: 4.0 is a lone last timestamp
    segments, seek = window_segments(tokens, TB, seek=0, window_frames=3000, decode=text_of)
    # a lone timestamp at the end after text: the window's speech ran on; the next window is the next 30 s
    assert [(s.start, s.end, s.text) for s in segments] == [(0.0, 2.0, "w1 w2"), (2.5, 4.0, "w3")]
    assert seek == 3000


def test_a_window_ending_in_a_closed_pair_seeks_to_that_timestamp():
    tokens = [ts(0.0), 1, ts(1.0), ts(1.0), 2, ts(3.2), ts(3.2)]
    segments, seek = window_segments(tokens, TB, seek=6000, window_frames=3000, decode=text_of)
    assert [(s.start, s.end) for s in segments] == [(60.0, 61.0), (61.0, 63.2)]
    assert seek == 6000 + 160 * 2  # 3.2 s is timestamp step 160, two frames each


def test_without_timestamps_a_window_is_one_segment():
    segments, seek = window_segments([5, 6, 7], TB, seek=3000, window_frames=1200, decode=text_of)
    assert [(s.start, s.end, s.text, s.tokens) for s in segments] == [(30.0, 42.0, "w5 w6 w7", [5, 6, 7])]
    assert seek == 4200


def test_a_single_last_timestamp_without_pairs_sets_the_segment_end():
    segments, seek = window_segments([ts(0.0), 5, 6, ts(7.5)], TB, seek=0, window_frames=3000, decode=text_of)
    assert [(s.start, s.end) for s in segments] == [(0.0, 7.5)] and seek == 3000


@pytest.mark.parametrize(("text", "low"), [("the cat sat on the mat", True), ("na " * 200, False)])
def test_compression_ratio_finds_repetition(text, low):
    assert (compression_ratio(text) < 2.4) == low
