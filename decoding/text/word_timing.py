"""Word timestamps of a Whisper window, read from its alignment heads' cross-attention as openai-whisper's
``word_timestamps`` reads them (``whisper/timing.py``; faster-whisper and HF's ``return_token_timestamps``
follow the same method).

A few cross-attention heads of Whisper's decoder (its ``alignment_heads``) look at the audio frames where
the token they predict is spoken. The window's text is run once more, teacher-forced (``<|startoftranscript|>``,
language, task, ``<|notimestamps|>``, the text, end of text), and those heads' attention over the window's
frames (each 20 ms, cut to the audio the window holds) is normalized per frame, median-filtered over
time and averaged over the heads: a token-by-frame matrix. Dynamic time warping through it pairs each
token with the frames where it is said; a word starts where its first token's path first moves and
ends where the next word's does. Then openai-whisper's fixes: punctuation joins its neighbour word,
words that run past twice the median word length at a sentence or segment boundary are cut back, and
each segment's start and end follow its words.

Torch-free: the engine client computes the heads' scores on the worker (``decoding/engine/word_alignment.py``)
and hands them here.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

TOKENS_PER_SECOND = 50  # the encoder's positions: 20 ms each
MEDIAN_FILTER_WIDTH = 7
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END_MARKS = ".。!！?？"
UNSPACED_LANGUAGES = {"zh", "ja", "th", "lo", "my", "yue"}  # words are split on characters, not spaces


@dataclass
class WordTiming:
    word: str  # as Whisper wrote it (a leading space where the text has one)
    tokens: list[int]
    start: float  # seconds from the window's start, then from the audio's start
    end: float


@dataclass
class TimedSegment:
    """What word timing needs of a segment, and what it changes: its start and end follow its words."""

    start: float
    end: float
    text_tokens: list[int]  # the segment's tokens without timestamps
    words: list[WordTiming]


def split_words(tokens: list[int], decode: Callable[[list[int]], str], eot: int,
                language: str) -> tuple[list[str], list[list[int]]]:  # fmt: skip
    """Whisper's words: tokens joined until their text is whole characters, then, where the language spaces
    its words, joined until a space, a punctuation mark or a special token starts the next (openai-whisper's
    ``split_to_word_tokens``)."""
    pieces, piece_tokens = _split_on_unicode(tokens, decode)
    if language in UNSPACED_LANGUAGES:
        return pieces, piece_tokens
    words: list[str] = []
    word_tokens: list[list[int]] = []
    for piece, its_tokens in zip(pieces, piece_tokens, strict=True):
        special = its_tokens[0] >= eot
        if special or piece.startswith(" ") or piece.strip() in string.punctuation or not words:
            words.append(piece)
            word_tokens.append(list(its_tokens))
        else:
            words[-1] += piece
            word_tokens[-1].extend(its_tokens)
    return words, word_tokens


def _split_on_unicode(tokens: list[int], decode: Callable[[list[int]], str]) -> tuple[list[str], list[list[int]]]:
    whole = decode(tokens)
    replacement = "\ufffd"
    pieces: list[str] = []
    piece_tokens: list[list[int]] = []
    current: list[int] = []
    offset = 0
    for token in tokens:
        current.append(token)
        text = decode(current)
        at = text.find(replacement)
        if at < 0 or (offset + at < len(whole) and whole[offset + at] == replacement):
            pieces.append(text)
            piece_tokens.append(current)
            current = []
            offset += len(text)
    return pieces, piece_tokens


def median_filter(x: np.ndarray, width: int = MEDIAN_FILTER_WIDTH) -> np.ndarray:
    """The median over a ``width`` window along the last axis, the edges reflected (as torch's reflect pad)."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    return np.sort(windows, axis=-1)[..., pad]


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path through ``cost`` ([tokens, frames]) from its first cell to its last: the
    (token, frame) index pairs along it. Ties break as openai-whisper's: the diagonal step only when it is
    strictly cheapest, then the step down, else the step right. The cells of one anti-diagonal depend only
    on the two before it, so each is one vector step."""
    n, m = cost.shape
    total = np.full((n + 1, m + 1), np.inf)
    trace = np.full((n + 1, m + 1), -1, dtype=np.int8)
    total[0, 0] = 0.0
    for diagonal in range(2, n + m + 1):  # cells (i, j), i + j = diagonal, 1 <= i <= n, 1 <= j <= m
        i = np.arange(max(1, diagonal - m), min(n, diagonal - 1) + 1)
        j = diagonal - i
        c0, c1, c2 = total[i - 1, j - 1], total[i - 1, j], total[i, j - 1]
        diagonal_best = (c0 < c1) & (c0 < c2)
        down_best = ~diagonal_best & (c1 < c0) & (c1 < c2)
        step = np.where(diagonal_best, 0, np.where(down_best, 1, 2))
        total[i, j] = cost[i - 1, j - 1] + np.where(step == 0, c0, np.where(step == 1, c1, c2))
        trace[i, j] = step
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j = n, m
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


def align_words(scores: np.ndarray, text_tokens: list[int], num_frames: int, decode: Callable[[list[int]], str],
                eot: int, language: str, prefix: int) -> list[WordTiming]:  # fmt: skip
    """The words of ``text_tokens`` timed from the alignment heads' ``scores`` ([heads, positions, encoder
    positions]: query·key / sqrt(head size), before the softmax) over the teacher-forced sequence, whose
    first ``prefix`` positions are the start-of-transcript sequence; ``num_frames``: the window's 10 ms
    feature frames holding audio."""
    if not text_tokens:
        return []
    weights = scores[:, :, : num_frames // 2].astype(np.float64)
    weights = np.exp(weights - weights.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    mean = weights.mean(axis=-2, keepdims=True)
    std = weights.std(axis=-2, keepdims=True)
    weights = median_filter((weights - mean) / std)
    matrix = weights.mean(axis=0)[prefix:-1]  # the rows predicting the text's tokens and end of text
    text_indices, time_indices = dtw(-matrix)
    words, word_tokens = split_words(text_tokens + [eot], decode, eot, language)
    if len(word_tokens) <= 1:
        return []
    boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] / TOKENS_PER_SECOND
    starts, ends = jump_times[boundaries[:-1]], jump_times[boundaries[1:]]
    # the last word is end of text: it has no start of its own
    return [WordTiming(word, tokens, float(start), float(end))
            for word, tokens, start, end in zip(words[:-1], word_tokens[:-1], starts, ends, strict=True)]  # fmt: skip


def merge_punctuations(alignment: list[WordTiming], prepended: str = PREPEND_PUNCTUATIONS,
                       appended: str = APPEND_PUNCTUATIONS) -> None:  # fmt: skip
    """Opening marks join the word after them, closing marks the word before (emptying the mark's own)."""
    i, j = len(alignment) - 2, len(alignment) - 1
    while i >= 0:
        previous, following = alignment[i], alignment[j]
        if previous.word.startswith(" ") and previous.word.strip() in prepended:
            following.word = previous.word + following.word
            following.tokens = previous.tokens + following.tokens
            previous.word, previous.tokens = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(alignment):
        previous, following = alignment[i], alignment[j]
        if not previous.word.endswith(" ") and following.word in appended:
            previous.word = previous.word + following.word
            previous.tokens = previous.tokens + following.tokens
            following.word, following.tokens = "", []
        else:
            i = j
        j += 1


def time_segments(segments: list[TimedSegment], alignment: list[WordTiming], offset: float,
                  last_speech: float) -> float:  # fmt: skip
    """Give each of one window's ``segments`` its words (``alignment``: the window's, in seconds from its
    start, ``offset``), as openai-whisper's ``add_word_timestamps``; returns the new end of speech
    (``last_speech``: the previous one)."""
    durations = np.array([w.end - w.start for w in alignment])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    longest = median * 2
    if len(durations):  # words at sentence boundaries are at most twice the median long
        for i in range(1, len(alignment)):
            if alignment[i].end - alignment[i].start > longest:
                if alignment[i].word in SENTENCE_END_MARKS:
                    alignment[i].end = alignment[i].start + longest
                elif alignment[i - 1].word in SENTENCE_END_MARKS:
                    alignment[i].start = alignment[i].end - longest
    merge_punctuations(alignment)
    index = 0
    for segment in segments:
        saved, words = 0, []
        while index < len(alignment) and saved < len(segment.text_tokens):
            timing = alignment[index]
            if timing.word:
                words.append(WordTiming(timing.word, timing.tokens, round(offset + timing.start, 2),
                                        round(offset + timing.end, 2)))  # fmt: skip
            saved += len(timing.tokens)
            index += 1
        if words:
            last_speech = _fix_segment_edges(segment, words, median, longest, last_speech)
        segment.words = words
    return last_speech


def _fix_segment_edges(segment: TimedSegment, words: list[WordTiming], median: float, longest: float,
                       last_speech: float) -> float:  # fmt: skip
    """openai-whisper's cuts of too-long first and last words (after a pause, against the segment's own
    timestamps); the segment's start and end then follow its words."""
    first = words[0]
    if first.end - last_speech > median * 4 and (
        first.end - first.start > longest or (len(words) > 1 and words[1].end - first.start > longest * 2)
    ):
        if len(words) > 1 and words[1].end - words[1].start > longest:
            boundary = max(words[1].end / 2, words[1].end - longest)
            first.end = words[1].start = boundary
        first.start = max(0.0, first.end - longest)
    if segment.start < first.end and segment.start - 0.5 > first.start:
        first.start = max(0.0, min(first.end - median, segment.start))
    else:
        segment.start = first.start
    last = words[-1]
    if segment.end > last.start and segment.end + 0.5 < last.end:
        last.end = max(last.start + median, segment.end)
    else:
        segment.end = last.end
    return segment.end
