"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: chat's path with Anthropic's shapes.

A message walks ``server.api.generation`` as chat does: the body translated once, the conversation
rendered by the chat template (with the offered tools), admission, submission; its reply is read by
the tool-call parser the server is configured with (``--tool-call-parser``), as chat's and the
Responses API's are. ``count_tokens`` renders the same conversation and counts its ids.
"""

from __future__ import annotations

from contextlib import aclosing
from functools import partial
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sse_starlette.sse import EventSourceResponse

from decoding.params import check_size
from server.api.generation import (
    admitted,
    engine_of,
    engine_rows,
    images_of,
    served_model,
    submit,
    templated,
    translated,
)
from server.api.messages.errors import documented_errors
from server.api.messages.events import message_events
from server.api.messages.format import Reply, new_id
from server.api.messages.protocol import Conversation, CountTokensRequest, MessagesRequest
from server.api.messages.thinking import thinking_plan
from server.http.auth import require_api_key
from server.http.errors import from_output
from server.http.limits import caller_hold
from server.output.exact_json import ExactJSONResponse
from server.output.streaming import merge, until_disconnect
from server.output.tool_parser import PARSERS, ParserFactory
from server.translate.structured import answer_after_thinking, reasoning_of
from server.translate.thinking import with_thinking_budget

router = APIRouter(dependencies=[Depends(require_api_key)])
ERRORS = ("400", "401", "404", "413", "429", "500", "503")
STREAM = {"content": {"text/event-stream": {"schema": {"type": "string"}}},
          "description": "The message; with `stream: true` Anthropic's named server-sent events"}  # fmt: skip


def tool_parser(request: Request, body: Conversation) -> ParserFactory | None:
    """The configured parser for the offered tools (a call naming another tool stays text)."""
    tool_use = body.tool_use()
    offered = [tool.function.name for tool in tool_use.offered()] if tool_use else []
    return partial(PARSERS[request.app.state.settings.tool_call_parser], offered) if offered else None


@router.post("/v1/messages", responses={200: STREAM, **documented_errors(ERRORS)})
async def create_message(body: MessagesRequest, request: Request) -> Response:
    client = engine_of(request)
    model = served_model(client, body.model)
    body, params = translated(request, client, body, max_model_len=client.max_model_len)
    thinking = thinking_plan(body.thinking, reasoning_of(request))  # the split, the template's switch, a budget
    params = answer_after_thinking(params, thinking.reasoning)  # a constraint shapes the answer, after the thinking
    messages = body.template_messages()
    images = await images_of(request, client, body.image_parts())
    prompt_ids, params = await templated(client, body, params, messages, body.template_tools(),
                                         thinking.template_kwargs, images)  # fmt: skip
    if thinking.budget is not None and thinking.reasoning is not None:
        params = await with_thinking_budget(client, params, thinking.reasoning, thinking.budget)
    params = await admitted(client, params, [prompt_ids], "messages")
    reply = Reply(new_id("msg"), model, tool_parser(request, body), thinking.reasoning, thinking.show)
    hold = caller_hold(request.scope.get("state", {}))
    if hold is not None:  # the caller's limit counts the rows this request will run
        hold.grow(engine_rows(params), "num_beams" if params.num_beams > 1 else "n")
    streams = await submit(request, client, reply.message_id, [prompt_ids], params)
    if body.stream:
        return EventSourceResponse(message_events(streams, reply), ping=15)
    return ExactJSONResponse(await until_disconnect(request, _whole(streams, reply)))  # 1e999 in an input, as written


async def _whole(streams: list, reply: Reply) -> dict[str, Any]:
    """The finished message, every output fed through the same blocks a stream sends."""
    async with aclosing(merge(streams)) as merged:
        async for _, output in merged:
            if output.error:
                raise from_output(output)
            reply.feed(output)
    return reply.message()


@router.post("/v1/messages/count_tokens", responses=documented_errors(ERRORS))
async def count_tokens(body: CountTokensRequest, request: Request) -> dict[str, int]:
    """The prompt's tokens for this conversation, as a message's prompt renders it."""
    client = engine_of(request)
    served_model(client, body.model)
    for name, items in body.sized_lists().items():
        check_size(name, items)
    for param, texts in body.rendered_texts().items():
        client.check_text_size(texts, param)
    tool_use = body.tool_use()
    if tool_use is not None:
        tool_use.check()
    kwargs = thinking_plan(body.thinking, reasoning_of(request)).template_kwargs
    messages = body.template_messages()
    images = await images_of(request, client, body.image_parts())
    prompt_ids = await client.apply_chat_template(messages, body.template_tools(),
                                                  **({"template_kwargs": kwargs} if kwargs else {}),
                                                  **({"images": images} if images else {}))  # fmt: skip
    return {"input_tokens": len(prompt_ids)}
