"""A Whisper window's tokens read as openai-whisper's ``transcribe()`` reads them: its segments, and where
the next window starts.

Whisper decodes 30 s of audio at a time (3000 feature frames of 10 ms). With timestamps, a window's
tokens are text between pairs of timestamp tokens (``<|1.20|>``: 0.02 s steps from the window's
start); each closed pair ends a segment, and the next window starts at the last timestamp said, unless
the window ended on a lone timestamp (its speech ran to the end) or said none, when it starts after the
whole window. Without timestamps a window is one segment. Torch-free: the engine client's transcription
loop (``decoding/engine/transcription.py``) calls it between windows.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

FRAMES_PER_WINDOW = 3000  # 30 s of 10 ms feature frames
SECONDS_PER_FRAME = 0.01
SECONDS_PER_TIMESTAMP = 0.02
FRAMES_PER_TIMESTAMP = 2  # the encoder's stride: a timestamp step is two feature frames


@dataclass
class WindowSegment:
    start: float  # seconds from the audio's start
    end: float
    tokens: list[int]  # the segment's tokens, timestamps included (as OpenAI's verbose_json lists them)
    text: str


def window_segments(
    tokens: list[int], timestamp_begin: int, seek: int, window_frames: int, decode: Callable[[list[int]], str]
) -> tuple[list[WindowSegment], int]:
    """(the segments of one window's ``tokens`` (end of text excluded), the next window's first frame).

    ``seek``: the window's first frame; ``window_frames``: the frames it covered (fewer at the end of the
    audio); ``decode``: text of token ids, timestamps dropped."""
    offset = seek * SECONDS_PER_FRAME
    is_timestamp = [token >= timestamp_begin for token in tokens]
    single_ending = single_timestamp_ending(tokens, timestamp_begin)
    closes = [i + 1 for i in range(len(tokens) - 1) if is_timestamp[i] and is_timestamp[i + 1]]
    if closes:
        if single_ending:
            closes.append(len(tokens))
        segments, last = [], 0
        for close in closes:
            piece = tokens[last:close]
            start = offset + (piece[0] - timestamp_begin) * SECONDS_PER_TIMESTAMP
            end = offset + (piece[-1] - timestamp_begin) * SECONDS_PER_TIMESTAMP
            segments.append(WindowSegment(start, end, piece, decode(piece)))
            last = close
        if single_ending:
            return segments, seek + window_frames
        return segments, seek + (tokens[last - 1] - timestamp_begin) * FRAMES_PER_TIMESTAMP
    duration = window_frames * SECONDS_PER_FRAME
    stamps = [token for token in tokens if token >= timestamp_begin]
    if stamps and stamps[-1] != timestamp_begin:  # a lone last timestamp says where the speech ended
        duration = (stamps[-1] - timestamp_begin) * SECONDS_PER_TIMESTAMP
    return [WindowSegment(offset, offset + duration, tokens, decode(tokens))], seek + window_frames


def single_timestamp_ending(tokens: list[int], timestamp_begin: int) -> bool:
    """The window ended on a lone timestamp after text (its speech ran to its end): openai-whisper's
    ``single_timestamp_ending``."""
    return len(tokens) >= 2 and tokens[-2] < timestamp_begin <= tokens[-1]


def compression_ratio(text: str) -> float:
    """openai-whisper's repetition measure: the text's bytes over their zlib-compressed bytes."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0
