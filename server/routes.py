"""Thin handlers: parse, tokenize and check through the engine client, submit, format.

The request's path: ``server.translate`` maps the body (``server.schemas``) to ``GenerationParams``;
the engine client tokenizes off the event loop and checks the request against the model
(``decoding.params.model_checks``); ``respond`` submits one engine request per prompt and hands the
streams to ``server.streaming`` with the endpoint's formatter from ``server.responses``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette.sse import EventSourceResponse

from decoding import EngineClient, GenerationParams, RequestOutput
from decoding.params import guidance_active
from server.auth import require_api_key
from server.errors import APIError, unavailable
from server.guidance import with_negative_prompt_ids
from server.limits import caller_hold
from server.presets import presets_of
from server.responses import ChatFormat, CompletionFormat, now
from server.schemas import ChatCompletionRequest, CompletionRequest
from server.streaming import collect_all, sse_events, until_disconnect
from server.tool_parser import PARSERS
from server.watermark_protocol import with_server_watermark

router = APIRouter()
api = APIRouter(dependencies=[Depends(require_api_key)])


def engine_of(request: Request) -> EngineClient:
    client = getattr(request.app.state, "engine", None)
    if client is None:
        raise unavailable("the model is still loading", code="loading")
    return client


def served_model(client: EngineClient, model: str | None) -> str:
    """The name responses carry; ``model`` may be omitted since one model is served (as vLLM allows)."""
    if model is not None and model != client.model_name:
        raise APIError(404, f"The model '{model}' does not exist; this server serves '{client.model_name}'",
                       param="model", code="model_not_found")  # fmt: skip
    return client.model_name


async def submit(
    client: EngineClient, request_id: str, prompts: list[list[int]], params: GenerationParams
) -> list[AsyncIterator[RequestOutput]]:
    """One engine request per prompt; if one is refused (queue full), the ones before it are aborted."""
    streams: list[AsyncIterator[RequestOutput]] = []
    try:
        for i, ids in enumerate(prompts):
            streams.append(client.generate(f"{request_id}-{i}", ids, params))
    except Exception:
        for i in range(len(streams)):
            await client.abort(f"{request_id}-{i}")
        raise
    return streams


def engine_rows(params: GenerationParams) -> int:
    """Rows one prompt runs in the engine: its beams, else its ``n`` sequences; twice with guidance."""
    rows = params.num_beams if params.num_beams > 1 else params.n
    return rows * (2 if guidance_active(params) else 1)


def _widest_field(params: GenerationParams, num_prompts: int) -> str:
    """The field to name when a request runs too many rows."""
    if params.num_beams > 1:
        return "num_beams"
    return "n" if params.n > 1 or num_prompts == 1 else "prompt"


async def respond(
    request: Request, client: EngineClient, fmt: CompletionFormat | ChatFormat, prompts: list[list[int]],
    params: GenerationParams, stream: bool,
) -> Response:  # fmt: skip
    hold = caller_hold(request.scope.get("state", {}))
    if hold is not None:  # the caller's limit counts the rows this request will run
        hold.grow(len(prompts) * engine_rows(params), _widest_field(params, len(prompts)))
    streams = await submit(client, fmt.request_id, prompts, params)
    if stream:
        return EventSourceResponse(sse_events(streams, fmt), ping=15)
    return JSONResponse(fmt.body(await until_disconnect(request, collect_all(streams))))


@api.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    client = engine_of(request)
    model = served_model(client, body.model)
    body = presets_of(request).apply(body)  # request > preset > model defaults
    params = body.params(client.generation_defaults)  # a bad knob is a 400 before any tokenizer work
    params = with_server_watermark(request, params)  # request > server default
    given = body.prompts_or_error()
    client.check_text_size([p for p in given if isinstance(p, str)], "prompt")  # before the tokenizer runs
    prompts = [await client.tokenize(p) if isinstance(p, str) else list(p) for p in given]
    params = await with_negative_prompt_ids(client, params)
    client.check_request(params, prompts, "prompt")
    params = await client.compile_structured_output(params)  # off the event loop; a bad schema is a 400
    echo_texts = [await client.decode(ids) for ids in prompts] if body.echo else None
    fmt = CompletionFormat(f"cmpl-{uuid.uuid4().hex}", model, params.n, echo_texts=echo_texts,
                           logprobs=body.logprobs is not None, return_token_ids=body.return_token_ids,
                           include_usage=body.include_usage)  # fmt: skip
    return await respond(request, client, fmt, prompts, params, body.stream)


@api.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    client = engine_of(request)
    model = served_model(client, body.model)
    messages = body.messages_or_error()
    tools = body.template_tools()
    texts = [m["content"] for m in messages] + ([json.dumps(tools)] if tools else [])
    client.check_text_size(texts, "messages")  # before the template and tokenizer
    prompt_ids = await client.apply_chat_template(messages, tools=tools)
    body = presets_of(request).apply(body)  # request > preset > model defaults
    params = body.params(client.generation_defaults, room=client.max_model_len - len(prompt_ids))
    params = with_server_watermark(request, params)  # request > server default
    params = await with_negative_prompt_ids(client, params)
    client.check_request(params, [prompt_ids], "messages")
    params = await client.compile_structured_output(params)  # off the event loop; a bad schema is a 400
    parser = PARSERS[request.app.state.settings.tool_call_parser] if body.offered_tools() else None
    fmt = ChatFormat(f"chatcmpl-{uuid.uuid4().hex}", model, params.n, logprobs=params.logprobs is not None,
                     return_token_ids=body.return_token_ids, include_usage=body.include_usage,
                     tool_parser=parser)  # fmt: skip
    return await respond(request, client, fmt, [prompt_ids], params, body.stream)


# ---- models, health ---------------------------------------------------------------------------------
@api.get("/v1/models")
async def models(request: Request) -> dict:
    client = engine_of(request)
    created = now()
    data = [
        {
            "id": m.name,
            "object": "model",
            "created": created,
            "owned_by": "decoda",
            "role": m.role,
            "max_model_len": m.max_model_len,
            "context_length": m.max_model_len,
            "architecture": m.architecture,
            "model_type": m.model_type,
            "dtype": m.dtype,
            "quantization": m.quantization,
        }  # fmt: skip
        for m in client.served_models()
    ]
    return {"object": "list", "data": data}


@router.get("/health")
async def health(request: Request) -> Response:
    """Liveness: red once the worker thread is gone or blocked, so an orchestrator restarts the replica."""
    client = getattr(request.app.state, "engine", None)
    if client is not None and not client.is_alive():
        return JSONResponse({"status": "worker stopped"}, status_code=503)
    stuck = client.stuck() if client is not None else None
    if stuck:
        return JSONResponse({"status": "worker blocked", "reason": stuck}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/ready")
async def ready(request: Request) -> Response:
    client = getattr(request.app.state, "engine", None)
    if client is not None and client.is_ready():
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "not ready"}, status_code=503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    from server.metrics import CONTENT_TYPE

    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE)


__all__ = ["api", "router"]
