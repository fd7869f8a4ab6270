"""``POST /v1/watermark/detect``: is this text watermarked? transformers' ``WatermarkDetector``.

Detection needs no model, only its vocabulary size, BOS id and tokenizer: the handler tokenizes
``text`` through the engine client (off the event loop), then scores the ids with
``decoding.sampling.watermark.detect_watermark`` in a worker thread (each scored token may draw a fresh
vocabulary permutation: milliseconds each). The config defaults to the server's ``--watermark``,
which also watermarks every generation request that names none
(``server.watermark_protocol.with_server_watermark``).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import asdict

from fastapi import APIRouter, Depends, Request

from decoding import ParameterError
from server.auth import require_api_key
from server.routes import engine_of, served_model
from server.watermark_protocol import WatermarkDetectRequest, server_watermark

watermark_router = APIRouter(dependencies=[Depends(require_api_key)])


@watermark_router.post("/v1/watermark/detect")
async def detect(body: WatermarkDetectRequest, request: Request) -> dict:
    client = engine_of(request)
    served_model(client, body.model)
    config = body.watermarking_config.config() if body.watermarking_config else server_watermark(request)
    if config is None:
        raise ParameterError("this server has no default watermark (--watermark): send watermarking_config",
                             param="watermarking_config", code="missing_field")  # fmt: skip
    if (body.token_ids is None) == (body.text is None):
        raise ParameterError("give exactly one of token_ids and text", param="token_ids",
                             code="missing_field" if body.text is None else "invalid_parameter")  # fmt: skip
    if not math.isfinite(body.z_threshold):
        raise ParameterError(f"z_threshold must be a finite number, got {body.z_threshold}", param="z_threshold")
    param = "text" if body.text is not None else "token_ids"
    facts = client.facts
    if body.text is not None:
        ids = await client.tokenize(body.text, add_special_tokens=False)
    else:
        ids = list(body.token_ids or [])
        bad = [t for t in ids if not 0 <= t < facts.vocab_size]
        if bad:
            raise ParameterError(f"token_ids contains token id {bad[0]}, outside the vocabulary "
                                 f"[0, {facts.vocab_size})", param="token_ids")  # fmt: skip
    if len(ids) > facts.max_model_len:  # no model writes more; bounds the work one request can ask for
        raise ParameterError(f"{param} has {len(ids)} tokens; at most {facts.max_model_len} (the model's context) "
                             "are scored", param=param, code="too_long")  # fmt: skip
    from decoding.sampling.watermark import detect_watermark  # torch is imported only here

    result = await asyncio.to_thread(
        detect_watermark, ids, config, facts.vocab_size, bos_token_id=facts.bos_token_id,
        z_threshold=body.z_threshold, ignore_repeated_ngrams=body.ignore_repeated_ngrams, param=param,
    )  # fmt: skip
    return {"object": "watermark.detection", **asdict(result)}


__all__ = ["watermark_router"]
