"""A conversation with images, laid out as the model's processor lays it out, and the engine's record of it.

The prompt is built by the model's own processor through ``apply_chat_template(..., tokenize=True)``, as a
transformers user builds it (so the token ids are theirs: the family's image markers, its placeholder
tokens expanded to as many as the image yields, tiles and rows where the family has them); the images
go into the conversation's ``{"type": "image"}`` parts, in order. What the processor returns besides the
ids (``pixel_values``, ``image_grid_thw``, ``pixel_attention_mask``, ``image_sizes``) is kept as the
vision tower's input (``pixel_inputs``), run once when the prompt's image tokens are first fed.

The record also holds what the rest of the engine needs and must never recompute:
- ``positions``: where the placeholder tokens sit, whose input embeddings the image features replace (in
  order: HF's ``masked_scatter`` fills them in the order the features come);
- ``cache_keys``: what the prefix cache keys those positions by instead of the placeholder id (which is
  the same for every image): the image's content hash, so the same image in a later turn is served from
  cache and two images behind the same text never share K/V (``kv/media_rows.py``);
- ``rope``: Qwen2-VL's 3D M-RoPE positions of the prompt and the delta its generated tokens add;
- ``bidirectional``: Gemma 3's image spans (and GIT's image), inside which tokens attend both ways during the prefill;
- ``text_start``: GIT's image is the model's own prefix, not placeholders in its text: its positions come first
  and the text after them numbers its positions from 0 (``vision.git_prompt``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image

TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")


@dataclass
class ImagePrompt:
    """The engine's record of a prompt's images (``PromptIds.media``)."""

    images: list[str]  # each image's content hash (sha256 of its decoded pixels), in prompt order
    params: list[str]  # the body path each image came from (errors name it)
    pixel_inputs: dict[str, torch.Tensor]  # the vision tower's inputs, as the processor made them
    positions: torch.Tensor  # [num_image_tokens] the placeholder tokens' prompt positions, in order
    cache_keys: dict[int, Hashable]  # prompt position -> the prefix cache's key for the token there
    rope: torch.Tensor | None = None  # [3, prompt_len] M-RoPE positions (Qwen2-VL), else None
    rope_delta: int = 0  # a generated token at position p has M-RoPE position p + rope_delta
    bidirectional: tuple[tuple[int, int], ...] = ()  # [start, end) spans attending both ways (Gemma 3, GIT)
    text_start: int = 0  # GIT: the prompt's text (generate()'s input_ids) starts after its image's positions
    features: torch.Tensor | None = field(default=None, repr=False)  # [num_image_tokens, hidden] once run

    def chunk_features(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(offsets in ``[start, end)``, their features) for a prompt chunk; None when it holds no image token."""
        inside = (self.positions >= start) & (self.positions < end)
        if not bool(inside.any()):
            return None
        if self.features is None:
            raise RuntimeError("the image features are needed before the vision tower ran")
        return self.positions[inside] - start, self.features[inside]

    def let_go(self) -> None:
        """The prompt is in the cache: its pixels and features are not needed again."""
        self.features = None
        self.pixel_inputs = {}

    def holds_images(self, start: int, end: int) -> bool:
        return bool(((self.positions >= start) & (self.positions < end)).any())

    def span_end(self, position: int) -> int:
        """The end of the bidirectional span ``position`` falls inside (a prefill chunk may not cut it), or
        ``position`` itself when it is in none."""
        for start, end in self.bidirectional:
            if start < position < end:
                return end
        return position


def image_digest(image: Image.Image) -> str:
    """The content hash of the decoded pixels (not the file's bytes or its URL): the same picture sent as
    PNG and as WebP, or from two addresses, is one image to the cache."""
    digest = hashlib.sha256(f"{image.mode}:{image.width}x{image.height}:".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()


def image_token_id(config: Any) -> int:
    """The placeholder token id the family's processor expands and its model replaces."""
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    raise ValueError(f"{type(config).__name__} names no image token id")


def with_images(messages: list[dict], images: Sequence[Image.Image]) -> list[dict]:
    """The conversation with each ``{"type": "image"}`` part holding its image, in order (how transformers'
    processors read images from a conversation)."""
    remaining = list(images)
    placed = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image":
                    if not remaining:
                        raise ValueError("more image parts than images")
                    part = {**part, "image": remaining.pop(0)}
                parts.append(part)
            message = {**message, "content": parts}
        placed.append(message)
    if remaining:
        raise ValueError(f"{len(remaining)} image(s) without an image part in the messages")
    return placed


def build_image_prompt(
    processed: dict[str, Any], config: Any, digests: list[str], params: list[str], rope_index: Any = None
) -> tuple[list[int], ImagePrompt]:
    """(token ids, the record) from the processor's output for one conversation.

    ``rope_index``: the model's ``get_rope_index`` where it has one (Qwen2-VL), which turns the ids and the
    image grids into 3D positions and the delta of the positions after them.
    """
    ids = processed["input_ids"][0]
    token = image_token_id(config)
    positions = (ids == token).nonzero().flatten()
    pixel_inputs = {name: value for name, value in processed.items() if name not in TEXT_INPUTS and value is not None}
    prompt = ImagePrompt(digests, params, pixel_inputs, positions, _cache_keys(positions.tolist(), digests))
    if rope_index is not None and "image_grid_thw" in processed:
        extra = {"mm_token_type_ids": processed["mm_token_type_ids"]} if "mm_token_type_ids" in processed else {}
        rope, delta = rope_index(processed["input_ids"], image_grid_thw=processed["image_grid_thw"], **extra)
        prompt.rope, prompt.rope_delta = rope[:, 0].clone(), int(delta.flatten()[0])
    if "token_type_ids" in processed and _attends_both_ways(config):
        prompt.bidirectional = _runs(processed["token_type_ids"][0].eq(1).nonzero().flatten().tolist())
    return ids.tolist(), prompt


def _attends_both_ways(config: Any) -> bool:
    """Gemma 3: its image tokens see each other during the prefill (``token_type_ids`` blocks)."""
    return getattr(config, "model_type", "") in ("gemma3",)


def _runs(positions: list[int]) -> tuple[tuple[int, int], ...]:
    """Maximal runs of consecutive positions as ``[start, end)`` spans."""
    spans: list[tuple[int, int]] = []
    for position in positions:
        if spans and spans[-1][1] == position:
            spans[-1] = (spans[-1][0], position + 1)
        else:
            spans.append((position, position + 1))
    return tuple(spans)


def _cache_keys(positions: list[int], digests: list[str]) -> dict[int, Hashable]:
    """The prefix cache's key for each placeholder position.

    Where the placeholders come in one run per image (LLaVA, Qwen2-VL, Gemma 3), the tokens of image j are
    keyed by the hash of images 0..j: a later turn that repeats the conversation's images hits the cache
    up to the first new one. Where an image is laid out in several runs (Idefics3's tiles), the runs cannot
    be told apart by image, so every placeholder is keyed by the hash of all the prompt's images.
    """
    runs = _runs(positions)
    keys: dict[int, Hashable] = {}
    if len(runs) == len(digests):
        chain = hashlib.sha256()
        for (start, end), digest in zip(runs, digests, strict=True):
            chain.update(digest.encode())
            key = chain.hexdigest()
            for index, position in enumerate(range(start, end)):
                keys[position] = ("image", key, index)
        return keys
    everything = hashlib.sha256("".join(digests).encode()).hexdigest()
    return {position: ("image", everything, index) for index, position in enumerate(positions)}
