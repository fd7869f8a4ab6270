"""The vision stage: the image features of the prompt chunks this step feeds, run just before the forward.

A request's images go through the vision tower the first time one of its prompt chunks holds an image
token, all of the prompt's images in one call (the call ``generate()`` makes, so the features are its
features); a prompt whose image tokens the prefix cache already holds never runs it (a later turn about
the same image costs no vision time). The features stay with the request until its prompt is in (a
request preempted half-way needs them again) and are let go then. A tower that fails on one request's
images fails that request alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from decoding.engine.forward_stage import Fed
from decoding.kv.media_rows import RowMedia
from decoding.model.vision_tower import image_features
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
    return RowMedia(prompt.cache_keys, rope, prompt.rope_delta, prompt.bidirectional)


def feed(model: torch.nn.Module, batch: list[Fed], fail: Callable[[DecodingStrategy, str], None],
         observer: EngineObserver) -> list[Fed]:  # fmt: skip
    """The batch with each prompt chunk's image features attached (the tower run where needed); the rows of
    a request whose images the tower cannot take leave it, failed."""
    failed: set[int] = set()
    for fed in batch:
        prompt = fed.strategy.request.image_prompt
        if not fed.prompt or prompt is None or id(fed.strategy) in failed:
            continue
        row = fed.row_input
        end = row.start + len(row.token_ids)
        if not prompt.holds_images(row.start, end):
            continue
        if prompt.features is None:
            try:
                started = time.perf_counter()
                prompt.features = image_features(model, prompt.pixel_inputs)
                observer.on_images_encoded(len(prompt.images), time.perf_counter() - started)
            except Exception as exc:
                logger.exception("the vision tower failed on request %s", fed.strategy.request.request_id)
                fail(fed.strategy, f"the vision tower failed on its images: {exc}")
                failed.add(id(fed.strategy))
                continue
            if prompt.features.shape[0] != prompt.positions.shape[0]:
                fail(fed.strategy, f"the images gave {prompt.features.shape[0]} features for "
                                   f"{prompt.positions.shape[0]} image tokens")  # fmt: skip
                failed.add(id(fed.strategy))
                continue
        row.image_features = prompt.chunk_features(row.start, end)
    return [fed for fed in batch if id(fed.strategy) not in failed]

