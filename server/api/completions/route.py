"""``POST /v1/completions``: prompts as sent (text tokenized off the event loop, or token ids), ``echo``."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from server.api.completions.format import CompletionFormat
from server.api.completions.protocol import CompletionRequest
from server.api.generation import admitted, engine_of, respond, served_model, translated
from server.http.auth import require_api_key

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    client = engine_of(request)
    model = served_model(client, body.model)
    body, params = translated(request, client, body)
    given = body.prompts_or_error()
    prompts = [await client.tokenize(p) if isinstance(p, str) else list(p) for p in given]
    params = await admitted(client, params, prompts, "prompt")
    echo_texts = [await client.decode(ids) for ids in prompts] if body.echo else None
    fmt = CompletionFormat(f"cmpl-{uuid.uuid4().hex}", model, params.n, echo_texts=echo_texts,
                           logprobs=body.logprobs is not None, return_token_ids=body.return_token_ids,
                           include_usage=body.include_usage)  # fmt: skip
    return await respond(request, client, fmt, prompts, params, body.stream)
