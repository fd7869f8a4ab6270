"""Word timing's parts (``decoding/text/word_timing.py``) against plain restatements of openai-whisper's
(``whisper/timing.py``): the dynamic time warping path (ties included), the median filter, the word split,
punctuation merging and the segment edges. The real model's word times against faster-whisper's are in
tests/test_whisper_ct2.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from decoding.text.word_timing import (
    TimedSegment,
    WordTiming,
    align_words,
    dtw,
    median_filter,
    merge_punctuations,
    split_words,
    time_segments,
)

EOT = 100


def reference_dtw(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """openai-whisper's ``dtw_cpu`` and ``backtrace``, cell by cell."""
    n, m = x.shape
    cost = np.full((n + 1, m + 1), np.inf)
    trace = -np.ones((n + 1, m + 1))
    cost[0, 0] = 0
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
            if c0 < c1 and c0 < c2:
                c, t = c0, 0
            elif c1 < c0 and c1 < c2:
                c, t = c1, 1
            else:
                c, t = c2, 2
            cost[i, j] = x[i - 1, j - 1] + c
            trace[i, j] = t
    i, j = n, m
    trace[0, :] = 2
    trace[:, 0] = 1
    path = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        if trace[i, j] == 0:
            i, j = i - 1, j - 1
        elif trace[i, j] == 1:
            i -= 1
        else:
            j -= 1
    pairs = np.array(path[::-1]).T
    return pairs[0], pairs[1]


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (6, 1), (5, 9), (12, 40), (30, 25)])
def test_dtw_takes_openai_whispers_path(shape):
    generator = np.random.default_rng(sum(shape))
    for costs in (generator.normal(size=shape), generator.integers(0, 3, size=shape).astype(float)):  # ties too
        ours, theirs = dtw(costs), reference_dtw(costs)
        assert np.array_equal(ours[0], theirs[0]) and np.array_equal(ours[1], theirs[1])


def test_median_filter_equals_torch_reflect_pad_and_sort():
    x = np.random.default_rng(0).normal(size=(3, 5, 40)).astype(np.float32)
    padded = F.pad(torch.from_numpy(x), (3, 3, 0, 0), mode="reflect")
    theirs = padded.unfold(-1, 7, 1).sort()[0][..., 3].numpy()
    assert np.array_equal(median_filter(x, 7), theirs)
    assert np.array_equal(median_filter(x[..., :3], 7), x[..., :3])  # too short to filter: as it is


PIECES = {1: " Hello", 2: ",", 3: " wor", 4: "ld", 5: " it", 6: "'s", 7: "\xe2", 8: "\x82\xac"}


def decode(ids: list[int]) -> str:
    """A byte-level tokenizer's decode: 7 and 8 are the two halves of one character."""
    raw = "".join(PIECES.get(i, "<|endoftext|>" if i == EOT else "") for i in ids).encode("latin-1")
    return raw.decode("utf-8", errors="replace")


def test_words_split_on_spaces_punctuation_and_whole_characters():
    words, tokens = split_words([1, 2, 3, 4, 5, 6, 7, 8, EOT], decode, EOT, "en")
    assert words == [" Hello", ",", " world", " it's\u20ac", "<|endoftext|>"]
    assert tokens == [[1], [2], [3, 4], [5, 6, 7, 8], [EOT]]
    words, tokens = split_words([3, 4, 7, 8], decode, EOT, "zh")  # no spaces between words: characters
    assert words == [" wor", "ld", "\u20ac"] and tokens == [[3], [4], [7, 8]]


def test_punctuation_joins_its_neighbours():
    alignment = [WordTiming(w, [i], i, i + 1) for i, w in enumerate([" (", "Hello", ",", " world", ")", "."])]
    merge_punctuations(alignment)
    assert [w.word for w in alignment] == ["", " (Hello,", "", " world).", "", ""]
    assert alignment[1].tokens == [0, 1, 2] and alignment[3].tokens == [3, 4, 5]


def test_a_clear_diagonal_times_each_word_where_its_tokens_are_said():
    # tokens 1, 3, 4, 5 spoken over frames 0-9, 10-19, 20-29, 30-34 (20 ms each), then silence where end of
    # text is looked for; the rows: <|notimestamps|> predicts the first token, each token the next, the last
    # one end of text
    tokens, frames = [1, 3, 4, 5], 40
    scores = np.full((2, 3 + len(tokens) + 2, frames), -5.0)
    for row, token_at in enumerate(range(len(tokens))):
        scores[:, 3 + row, token_at * 10 : token_at * 10 + 10] = 5.0
    scores[:, 3 + len(tokens) - 1, 35:] = -5.0
    scores[:, 3 + len(tokens), 35:] = 5.0
    words = align_words(scores, tokens, num_frames=2 * frames, decode=decode, eot=EOT, language="en", prefix=3)
    assert [w.word for w in words] == [" Hello", " world", " it"]
    assert [(w.start, w.end) for w in words] == [(0.0, 0.2), (0.2, 0.6), (0.6, 0.7)]


def test_segments_take_their_words_and_follow_their_edges():
    alignment = [WordTiming(" One", [1], 0.1, 0.4), WordTiming(" two.", [2, 3], 0.4, 0.7),
                 WordTiming(" Three", [4], 1.0, 1.3), WordTiming(".", [5], 1.3, 1.4)]  # fmt: skip
    segments = [TimedSegment(10.0, 10.8, [1, 2, 3], []), TimedSegment(10.8, 11.6, [4, 5], [])]
    last = time_segments(segments, alignment, offset=10.0, last_speech=9.0)
    assert [(w.word, w.start, w.end) for w in segments[0].words] == [(" One", 10.1, 10.4), (" two.", 10.4, 10.7)]
    # a merged mark keeps the times of the word it joins
    assert [(w.word, w.start, w.end) for w in segments[1].words] == [(" Three.", 11.0, 11.3)]
    assert (segments[0].start, segments[0].end) == (10.1, 10.7)  # within half a second: the words' edges
    assert (segments[1].start, segments[1].end) == (11.0, 11.3) and last == 11.3
