"""``POST /v1/chat/completions``: the body validated whole, then the chat template, then the context's room."""

from __future__ import annotations

import uuid
from functools import partial

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from server.api.chat.format import ChatFormat
from server.api.chat.protocol import ChatCompletionRequest
from server.api.generation import admitted, engine_of, images_of, respond, served_model, templated, translated
from server.http.auth import require_api_key
from server.output.tool_parser import PARSERS
from server.translate.structured import answer_after_thinking, reasoning_of
from server.translate.template_kwargs import thinking_allowed

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    client = engine_of(request)
    model = served_model(client, body.model)
    body, params = translated(request, client, body, max_model_len=client.max_model_len)
    reasoning = reasoning_of(request) if thinking_allowed(body.chat_template_kwargs) else None
    params = answer_after_thinking(params, reasoning)  # a constraint shapes the answer, after the thinking
    messages = body.messages_or_error()
    images = await images_of(request, client, body.image_parts())
    prompt_ids, params = await templated(client, body, params, messages, body.template_tools(), images=images)
    params = await admitted(client, params, [prompt_ids], "messages")
    tool_use = body.tool_use()
    offered = [tool.function.name for tool in tool_use.offered()] if tool_use else []
    parser_class = PARSERS[request.app.state.settings.tool_call_parser]
    parser = partial(parser_class, offered) if offered else None  # a call naming another tool stays content
    fmt = ChatFormat(f"chatcmpl-{uuid.uuid4().hex}", model, params.n, logprobs=params.logprobs is not None,
                     return_token_ids=body.return_token_ids, include_usage=body.include_usage,
                     tool_parser=parser, legacy_functions=body.functions is not None,
                     reasoning=reasoning)  # fmt: skip
    return await respond(request, client, fmt, [prompt_ids], params, body.stream)
