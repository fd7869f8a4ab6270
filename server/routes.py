"""Thin handlers: parse, tokenize through the engine client, submit, format."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette.sse import EventSourceResponse

from decoding import EngineClient, GenerationParams, ParameterError, RequestOutput
from server.auth import require_api_key
from server.errors import APIError, from_exception
from server.protocol import COMPLETIONS_DEFAULT_MAX_TOKENS, ChatCompletionRequest, CompletionRequest
from server.responses import Collected, chat_logprobs, completion_logprobs, now, usage
from server.streaming import sse_events

router = APIRouter()
api = APIRouter(dependencies=[Depends(require_api_key)])


def engine_of(request: Request) -> EngineClient:
    client = getattr(request.app.state, "engine", None)
    if client is None:
        raise APIError(503, "the model is still loading", type_="service_unavailable", code="loading",
                       headers={"Retry-After": "5"})  # fmt: skip
    return client


def check_model(client: EngineClient, model: str) -> None:
    if model != client.model_name:
        raise APIError(404, f"The model '{model}' does not exist; this server serves '{client.model_name}'",
                       param="model", code="model_not_found")  # fmt: skip


def check_context(client: EngineClient, prompt_len: int, max_tokens: int, param: str) -> None:
    limit = client.max_model_len
    if prompt_len + max_tokens > limit:
        raise APIError(
            400,
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the {param}, {max_tokens} for the completion). "
            f"Please reduce the length of the {param} or max_tokens.",
            param=param,
            code="context_length_exceeded",
        )


def check_prompt_ids(client: EngineClient, ids: list[int]) -> None:
    bad = [t for t in ids if not 0 <= t < client.vocab_size]
    if bad:
        raise ParameterError(f"prompt token ids must be in [0, {client.vocab_size}), got {bad[:5]}", param="prompt")


async def until_disconnect(request: Request, work: asyncio.Future) -> object:
    """Await ``work`` but cancel it (aborting its engine requests) if the client goes away."""
    task = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.25)
        if done:
            return task.result()
        if await request.is_disconnected():
            task.cancel()
            raise asyncio.CancelledError("client disconnected")


def submit(client: EngineClient, request_id: str, prompts: list[list[int]], params: GenerationParams) -> list:
    streams: list[AsyncIterator[RequestOutput]] = []
    try:
        for i, ids in enumerate(prompts):
            streams.append(client.generate(f"{request_id}-{i}", ids, params))
    except Exception:
        for i in range(len(streams)):
            asyncio.ensure_future(client.abort(f"{request_id}-{i}"))
        raise
    return streams


async def collect(stream: AsyncIterator[RequestOutput], request_id: str) -> Collected:
    collected = Collected()
    async for output in stream:
        if output.error:
            raise APIError(500, output.error, type_="server_error", code="internal")
        collected.add(output)
    return collected


# ---- /v1/completions -------------------------------------------------------------------------------
@api.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    client = engine_of(request)
    check_model(client, body.model)
    prompts = [client.tokenize(p) if isinstance(p, str) else list(p) for p in body.prompts_or_error()]
    for ids in prompts:
        check_prompt_ids(client, ids)
    max_tokens = body.requested_max_tokens() or COMPLETIONS_DEFAULT_MAX_TOKENS
    for ids in prompts:
        check_context(client, len(ids), max_tokens, "prompt")
    params = body.to_params(
        default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS,
        model_defaults=client.generation_defaults,
        logprobs=body.logprobs,
        prompt_logprobs=body.logprobs if body.echo and body.logprobs is not None else None,
    )
    client.check_params(params)
    request_id = f"cmpl-{uuid.uuid4().hex}"
    created, n = now(), params.n
    echo_texts = [client.decode(ids) for ids in prompts] if body.echo else None
    streams = submit(client, request_id, prompts, params)

    def choice_index(prompt_index: int, index: int) -> int:
        return prompt_index * n + index

    if body.stream:
        counts = {"prompt": 0, "completion": 0}
        seen_prompt: set[int] = set()

        echoed: set[tuple[int, int]] = set()

        def chunks_for(prompt_index: int, output: RequestOutput) -> list[dict]:
            if prompt_index not in seen_prompt:
                seen_prompt.add(prompt_index)
                counts["prompt"] += output.num_prompt_tokens
            chunks = []
            for delta in output.deltas:
                counts["completion"] += len(delta.token_ids)
                text = delta.text
                if echo_texts is not None and (prompt_index, delta.index) not in echoed:
                    echoed.add((prompt_index, delta.index))
                    text = echo_texts[prompt_index] + text
                choice = {
                    "index": choice_index(prompt_index, delta.index),
                    "text": text,
                    "logprobs": completion_logprobs(delta.logprobs, 0) if delta.logprobs is not None else None,
                    "finish_reason": delta.finish_reason.value if delta.finish_reason else None,
                }
                if body.return_token_ids:
                    choice["token_ids"] = delta.token_ids
                if delta.sequence_score is not None:
                    choice["sequence_score"] = delta.sequence_score
                chunks.append(_completion_chunk(request_id, created, body.model, [choice]))
            return chunks

        def usage_chunk() -> dict:
            return {
                **_completion_chunk(request_id, created, body.model, []),
                "usage": usage(counts["prompt"], counts["completion"]),
            }

        usage_fn = usage_chunk if body.include_usage else None
        return EventSourceResponse(sse_events(streams, chunks_for, usage_fn, request_id), ping=15)

    results = await until_disconnect(request, asyncio.gather(*(collect(s, request_id) for s in streams)))
    choices = []
    for prompt_index, collected in enumerate(results):
        for index in range(n):
            state = collected.choices.get(index)
            text = state.text if state else ""
            entry_logprobs = None
            if body.logprobs is not None:
                entries = list(state.logprobs if state else [])
                if echo_texts is not None:
                    entries = (collected.prompt_logprobs or []) + entries
                entry_logprobs = completion_logprobs(entries, 0)
            if echo_texts is not None:
                text = echo_texts[prompt_index] + text
            choice = {
                "index": choice_index(prompt_index, index),
                "text": text,
                "logprobs": entry_logprobs,
                "finish_reason": state.finish_reason if state else "length",
            }
            if body.return_token_ids:
                choice["token_ids"] = state.token_ids if state else []
            if state and state.sequence_score is not None:
                choice["sequence_score"] = state.sequence_score
            choices.append(choice)
    prompt_tokens = sum(r.num_prompt_tokens for r in results)
    completion_tokens = sum(len(c.token_ids) for r in results for c in r.choices.values())
    return JSONResponse(
        {
            "id": request_id,
            "object": "text_completion",
            "created": created,
            "model": body.model,
            "choices": choices,
            "usage": usage(prompt_tokens, completion_tokens),
        }
    )


def _completion_chunk(request_id: str, created: int, model: str, choices: list[dict]) -> dict:
    return {"id": request_id, "object": "text_completion", "created": created, "model": model,
            "choices": choices, "usage": None}  # fmt: skip


# ---- /v1/chat/completions ----------------------------------------------------------------------------
@api.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    client = engine_of(request)
    check_model(client, body.model)
    prompt_ids = client.apply_chat_template(body.messages_or_error())
    requested = body.requested_max_tokens()
    if requested is not None:
        check_context(client, len(prompt_ids), requested, "messages")
    remaining = client.max_model_len - len(prompt_ids)
    if remaining < 1:
        check_context(client, len(prompt_ids), 1, "messages")
    params = body.to_params(
        default_max_tokens=remaining,
        model_defaults=client.generation_defaults,
        logprobs=body.logprobs_count(),
    )
    client.check_params(params)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    created = now()
    streams = submit(client, request_id, [prompt_ids], params)

    if body.stream:
        started: set[int] = set()
        counts = {"prompt": 0, "completion": 0}

        def chunks_for(_: int, output: RequestOutput) -> list[dict]:
            counts["prompt"] = output.num_prompt_tokens
            chunks = []
            for delta in output.deltas:
                counts["completion"] += len(delta.token_ids)
                if delta.index not in started:
                    started.add(delta.index)
                    first = {"index": delta.index, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None}  # fmt: skip
                    chunks.append(_chat_chunk(request_id, created, body.model, [first]))
                if delta.text or delta.token_ids:
                    content: dict = {"content": delta.text}
                    if body.return_token_ids:
                        content["token_ids"] = delta.token_ids
                    choice = {
                        "index": delta.index,
                        "delta": content,
                        "logprobs": chat_logprobs(delta.logprobs) if delta.logprobs is not None else None,
                        "finish_reason": None,
                    }
                    chunks.append(_chat_chunk(request_id, created, body.model, [choice]))
                if delta.finish_reason is not None:
                    final = {"index": delta.index, "delta": {}, "logprobs": None,
                             "finish_reason": delta.finish_reason.value}  # fmt: skip
                    if delta.sequence_score is not None:
                        final["sequence_score"] = delta.sequence_score
                    chunks.append(_chat_chunk(request_id, created, body.model, [final]))
            return chunks

        def usage_chunk() -> dict:
            return {
                **_chat_chunk(request_id, created, body.model, []),
                "usage": usage(counts["prompt"], counts["completion"]),
            }

        usage_fn = usage_chunk if body.include_usage else None
        return EventSourceResponse(sse_events(streams, chunks_for, usage_fn, request_id), ping=15)

    (collected,) = await until_disconnect(request, asyncio.gather(collect(streams[0], request_id)))
    choices = []
    for index in range(params.n):
        state = collected.choices.get(index)
        message: dict = {"role": "assistant", "content": state.text if state else ""}
        choice = {
            "index": index,
            "message": message,
            "logprobs": chat_logprobs(state.logprobs) if (state and params.logprobs is not None) else None,
            "finish_reason": state.finish_reason if state else "length",
        }
        if body.return_token_ids:
            choice["token_ids"] = state.token_ids if state else []
        if state and state.sequence_score is not None:
            choice["sequence_score"] = state.sequence_score
        choices.append(choice)
    completion_tokens = sum(len(c.token_ids) for c in collected.choices.values())
    return JSONResponse(
        {
            "id": request_id,
            "object": "chat.completion",
            "created": created,
            "model": body.model,
            "choices": choices,
            "usage": usage(collected.num_prompt_tokens, completion_tokens),
        }
    )


def _chat_chunk(request_id: str, created: int, model: str, choices: list[dict]) -> dict:
    return {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": choices, "usage": None}  # fmt: skip


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
        }  # fmt: skip
        for m in client.served_models()
    ]
    return {"object": "list", "data": data}


@router.get("/health")
async def health() -> dict:
    return {"status": "ok"}


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


__all__ = ["api", "router", "from_exception"]
