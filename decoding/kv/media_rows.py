"""What a row whose prompt holds images needs from the pool besides its K/V, kept per row handle.

Four things, all fixed when the request starts and the same for every row of it (its beams, its ``n``
samples), so the pool keeps them by row handle as it keeps each row's prefix-cache root:

- ``keys``: the prefix cache keys a block by its token ids, and every image's placeholder tokens have
  the same id; at those positions the key holds the image's content hash instead, so two different
  images behind the same text never share a block and the same image in a later turn does;
- ``rope``/``rope_delta``: Qwen2-VL rotates by 3D positions (time, height, width): the prompt's come
  from its processor's grid, and every later token's is its position plus the delta;
- ``bidirectional``: Gemma 3's (and GIT's) image tokens attend to each other both ways while the prompt is fed;
- ``text_start``: GIT's image takes the row's first positions and its text's learned positions count from
  there (a token at position p has text position p - text_start).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowMedia:
    keys: dict[int, Hashable]  # prompt position -> the prefix cache's key for the token there
    rope: torch.Tensor | None = None  # [3, prompt_len] M-RoPE positions, on the engine's device
    rope_delta: int = 0
    bidirectional: tuple[tuple[int, int], ...] = ()  # [start, end) prompt spans
    text_start: int = 0


def keyed(token_ids: Sequence[int], media: RowMedia | None) -> Sequence[Hashable]:
    """``token_ids`` as the prefix cache keys them: image positions replaced by their content keys."""
    if media is None or not media.keys:
        return token_ids
    keys = media.keys
    return [keys.get(position, token) for position, token in enumerate(token_ids)]


def rope_positions(positions: torch.Tensor, media: RowMedia | None) -> torch.Tensor:
    """``[3, n]`` M-RoPE positions of a row's tokens at (1D) ``positions``: the prompt's own where they
    fall in it, the position plus the delta after it; a row without images rotates as text (all three
    the same)."""
    if media is None or media.rope is None:
        return positions.unsqueeze(0).expand(3, -1)
    prompt_len = media.rope.shape[1]
    inside = positions < prompt_len
    after = (positions + media.rope_delta).unsqueeze(0).expand(3, -1)
    prompt = media.rope[:, positions.clamp(max=prompt_len - 1)]
    return torch.where(inside.unsqueeze(0), prompt, after)


def both_ways(media: RowMedia | None, start: int, end: int) -> list[tuple[int, int]]:
    """The row's bidirectional spans that overlap its positions ``[start, end)``."""
    if media is None:
        return []
    return [(a, b) for a, b in media.bidirectional if a < end and b > start]
