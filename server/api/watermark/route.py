"""``POST /v1/watermark/detect``: is this text watermarked? transformers' ``WatermarkDetector``.

Detection needs no model, only its vocabulary size, BOS id and tokenizer: the handler tokenizes
``text`` through the engine client (off the event loop), then scores the ids with
``decoding.sampling.watermark.detect_watermark`` on one scoring thread (each scored token may draw a
fresh vocabulary permutation: milliseconds each). One thread, so a flood of detections queues
instead of taking every core from generation; the text's size is checked before the tokenizer
runs and the ids are at most the context long; a client that leaves stops its scoring. The
config defaults to the server's ``--watermark``,
which also watermarks every generation request that names none
(``server.translate.watermark.with_server_watermark``).
"""

from __future__ import annotations

import asyncio
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from functools import partial

from fastapi import APIRouter, Depends, Request

from decoding import ParameterError
from server.api.generation import engine_of, served_model
from server.api.watermark.protocol import WatermarkDetectRequest
from server.http.auth import require_api_key
from server.output.streaming import until_disconnect
from server.translate.watermark import server_watermark

router = APIRouter(dependencies=[Depends(require_api_key)])
_SCORER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decoda-watermark")


@router.post("/v1/watermark/detect")
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
        client.check_text_size([body.text], "text")  # before the tokenizer runs
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

    score = partial(detect_watermark, ids, config, facts.vocab_size, bos_token_id=facts.bos_token_id,
                    z_threshold=body.z_threshold, ignore_repeated_ngrams=body.ignore_repeated_ngrams,
                    param=param)  # fmt: skip
    result = await until_disconnect(request, _score_off_loop(score))
    return {"object": "watermark.detection", **asdict(result)}


async def _score_off_loop(score: partial) -> object:
    """Run ``score`` on the scoring thread; if this task is cancelled (the client left), the thread
    stops at its next n-gram instead of finishing work nobody reads."""
    stop = threading.Event()
    try:
        return await asyncio.get_running_loop().run_in_executor(_SCORER, partial(score, cancelled=stop.is_set))
    finally:
        stop.set()
