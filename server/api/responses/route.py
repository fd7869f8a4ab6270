"""``/v1/responses``: create (one body or the semantic event stream), retrieve, delete, list input items.

Creating walks chat's path (``server.api.generation``): the body translated once, then the
conversation (the stored one of ``previous_response_id``, then this request's input) rendered by the
chat template, then the context's room, admission, submission. A response with ``store`` (OpenAI's
default) is kept in the responses store (``server.api.responses.store``, opened on first use from
``--responses-store``) before its last event or its body goes out. With API keys configured, every
read names the caller (a digest of its key) and another caller's response is a 404, as if absent.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from server.api.generation import admitted, engine_of, engine_rows, served_model, submit, templated, translated
from server.api.responses.events import ResponseEvents, response_events
from server.api.responses.format import ResponseBuilder
from server.api.responses.items import new_id, template_messages
from server.api.responses.protocol import ResponsesRequest
from server.api.responses.store import ResponseStore, SqliteResponseStore, StoredResponse, page, stored_size
from server.http.auth import require_api_key
from server.http.errors import APIError
from server.http.limits import caller_hold, caller_key
from server.output.streaming import collect_all, until_disconnect
from server.output.tool_parser import PARSERS

logger = logging.getLogger(__name__)


class OneResourceRoute(APIRoute):
    """A method no route of a path takes is a 405 whose ``Allow`` names every method this API's routes
    take on that path (Starlette names only the first route's; a response's ``GET`` and ``DELETE``
    are two routes)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.methods and scope["method"] not in self.methods:
            methods = sorted({m for r in router.routes if getattr(r, "path", None) == self.path for m in r.methods})
            raise HTTPException(status_code=405, headers={"Allow": ", ".join(methods)})
        await super().handle(scope, receive, send)


router = APIRouter(dependencies=[Depends(require_api_key)], route_class=OneResourceRoute)


def store_of(request: Request) -> ResponseStore:
    """The app's responses store, made on first use from its settings (it opens its file off the loop)."""
    store = getattr(request.app.state, "responses_store", None)
    if store is None:
        settings = request.app.state.settings
        store = SqliteResponseStore(settings.responses_store_path(), settings.responses_ttl)
        request.app.state.responses_store = store
    return store


def owner_of(request: Request) -> str:
    """Whose responses a request sees: the digest of its key when the server has keys, else everyone's."""
    return caller_key(request.scope) if request.app.state.api_key_digests else ""


def not_found(response_id: str, param: str) -> APIError:
    return APIError(404, f"No response found with id '{response_id}'", param=param, code="response_not_found")


async def stored(request: Request, response_id: str, param: str = "response_id") -> StoredResponse:
    found = await store_of(request).get(response_id, owner_of(request))
    if found is None:
        raise not_found(response_id, param)
    return found


@router.post("/v1/responses")
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    client = engine_of(request)
    model = served_model(client, body.model)
    body, params = translated(request, client, body, max_model_len=client.max_model_len)
    earlier: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        earlier = (await stored(request, body.previous_response_id, "previous_response_id")).continued()
    input_items = body.input_items()
    conversation = earlier + input_items
    cap = request.app.state.settings.responses_max_bytes
    pending = StoredResponse("", "", {"output": []}, input_items, conversation)  # what the row holds before output
    if body.store is not False and cap and stored_size(pending) > cap:
        raise APIError(400, f"the conversation is larger than a stored response may be ({cap} bytes, "
                       "--responses-max-bytes); start a new one or send store: false", param="input",
                       code="conversation_too_large")  # fmt: skip
    messages = template_messages(body.instructions, conversation)
    prompt_ids, params = await templated(client, body, params, messages, body.template_tools())
    params = await admitted(client, params, [prompt_ids], "input")
    tool_use = body.tool_use()
    offered = [tool.function.name for tool in tool_use.offered()] if tool_use else []
    parser = partial(PARSERS[request.app.state.settings.tool_call_parser], offered) if offered else None
    builder = ResponseBuilder(new_id("resp"), model, body.echo(), logprobs=params.logprobs is not None,
                              tool_parser=parser)  # fmt: skip

    async def keep(response: dict[str, Any]) -> None:
        if body.store is False:
            return
        row = StoredResponse(response["id"], owner_of(request), response, input_items, conversation)
        if cap and stored_size(row) > cap:
            logger.warning("response %s is %d bytes, over --responses-max-bytes: not stored", row.id, stored_size(row))
            response["store"] = False
            return
        await store_of(request).put(row)

    hold = caller_hold(request.scope.get("state", {}))
    if hold is not None:  # the caller's limit counts the rows this request will run
        hold.grow(engine_rows(params), "num_beams" if params.num_beams > 1 else "n")
    streams = await submit(client, builder.response_id, [prompt_ids], params)
    if body.stream:
        return EventSourceResponse(response_events(streams, ResponseEvents(builder), keep), ping=15)
    (collected,) = await until_disconnect(request, collect_all(streams))
    response = builder.body(collected)
    await keep(response)
    return JSONResponse(response)


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, request: Request) -> Response:
    return JSONResponse((await stored(request, response_id)).response)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> Response:
    if not await store_of(request).delete(response_id, owner_of(request)):
        raise not_found(response_id, "response_id")
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(
    response_id: str, request: Request, after: str | None = None, before: str | None = None,
    limit: int = Query(default=20, ge=1, le=100), order: Literal["asc", "desc"] = "desc",
) -> Response:  # fmt: skip
    """OpenAI's page of the response's own input items (newest first unless ``order=asc``)."""
    found = await stored(request, response_id)
    return JSONResponse(page(found.input_items, after=after, before=before, limit=limit, order=order))
