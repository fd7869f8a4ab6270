"""The vision stage: the image features of the prompt chunks this step feeds, run just before the forward.

A request's images go through the vision tower the first time one of its prompt chunks holds an image
token: all of the prompt's images in one call (the call ``generate()`` makes), together with the other
prompts of the step whose inputs stack into the same call (``vision_tower.stack_key``). A prompt whose
image tokens the prefix cache already holds never runs it (a later turn about the same image costs no
vision time). The features stay with the request until its prompt is in (a request preempted half-way
needs them again) and are let go then. A tower that fails on one request's images fails that request alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from decoding.engine.forward_stage import Fed
from decoding.kv.media_rows import RowMedia
from decoding.model.vision_tower import image_features, stack_key, stacked
from decoding.state.request import Request
from decoding.strategies import DecodingStrategy
from decoding.telemetry import EngineObserver

logger = logging.getLogger(__name__)


def row_media(request: Request, device: torch.device) -> RowMedia | None:
    """What the pool keeps for each row of a request whose prompt holds images."""
    prompt = getattr(request, "image_prompt", None)  # (the scheduler's tests step stand-in requests)
    if prompt is None:
        return None
    rope = None if prompt.rope is None else prompt.rope.to(device)
    return RowMedia(prompt.cache_keys, rope, prompt.rope_delta, prompt.bidirectional, prompt.text_start)


def feed(model: torch.nn.Module, batch: list[Fed], fail: Callable[[DecodingStrategy, str], None],
         observer: EngineObserver) -> list[Fed]:  # fmt: skip
    """The batch with each prompt chunk's image features attached (the tower run where needed, this step's
    prompts together); the rows of a request whose images the tower cannot take leave it, failed."""
    chunks = [fed for fed in batch if fed.prompt and _holds_images(fed)]
    waiting = {id(fed.strategy): fed.strategy for fed in chunks if fed.strategy.request.image_prompt.features is None}
    failed = _encode(model, list(waiting.values()), fail, observer)
    for fed in chunks:
        if id(fed.strategy) not in failed:
            row, prompt = fed.row_input, fed.strategy.request.image_prompt
            row.image_features = prompt.chunk_features(row.start, row.start + len(row.token_ids))
    return [fed for fed in batch if id(fed.strategy) not in failed]


def _holds_images(fed: Fed) -> bool:
    prompt = fed.strategy.request.image_prompt
    row = fed.row_input
    return prompt is not None and prompt.holds_images(row.start, row.start + len(row.token_ids))


def _encode(model: torch.nn.Module, strategies: list[DecodingStrategy], fail: Callable[[DecodingStrategy, str], None],
            observer: EngineObserver) -> set[int]:  # fmt: skip
    """Run the tower for ``strategies``' prompts: those whose inputs stack (``stacked``) in one call, each
    other alone, a group that fails one by one; returns the ids of the strategies that failed."""
    failed: set[int] = set()
    groups: dict[object, list[DecodingStrategy]] = {}
    for strategy in strategies:
        key = stack_key(strategy.request.image_prompt.pixel_inputs)
        groups.setdefault(key if key is not None else id(strategy), []).append(strategy)
    for group in groups.values():
        prompts = [strategy.request.image_prompt for strategy in group]
        started = time.perf_counter()
        try:
            features = image_features(model, stacked([prompt.pixel_inputs for prompt in prompts]))
            counts = [prompt.positions.shape[0] for prompt in prompts]
            if features.shape[0] != sum(counts):
                raise ValueError(f"the images gave {features.shape[0]} features for {sum(counts)} image tokens")
        except Exception as exc:
            if len(group) > 1:  # find whose images broke the call
                for strategy in group:
                    failed |= _encode(model, [strategy], fail, observer)
                continue
            logger.exception("the vision tower failed on request %s", group[0].request.request_id)
            fail(group[0], f"the vision tower failed on its images: {exc}")
            failed.add(id(group[0]))
            continue
        observer.on_images_encoded(sum(len(prompt.images) for prompt in prompts), time.perf_counter() - started)
        for prompt, part in zip(prompts, features.split(counts), strict=True):
            prompt.features = part
    return failed
