"""``/v1/responses``: create (one body or the semantic event stream), retrieve (or resume a background
response's stream), cancel, delete, list input items.

Creating walks chat's path (``server.api.generation``): the body translated once, then the
conversation (the stored one of ``previous_response_id``, then this request's input) rendered by the
chat template, then the context's room, admission, submission. A response with ``store`` (OpenAI's
default) is kept in the responses store (``server.api.responses.store``, opened on first use from
``--responses-store``) before its last event or its body goes out; the conversation cap and the
caller's quota are checked before any work, and a store that fails after it still lets the answer
out (``server.api.responses.storing``). With API keys configured, every
read names the caller (a digest of its key) and another caller's response is a 404, as if absent.

``background: true`` stores the response as ``queued`` and answers at once (or streams its events):
the generation runs from a task the app owns (``server.api.responses.background``), which a client
that goes away does not stop; polling, ``?stream=true&starting_after=N`` and ``cancel`` find it by id.
At start-up, and when a read finds a response unfinished that no task here runs, the responses whose
replica stopped heart-beating ``--responses-lease`` seconds ago are stored as failed.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from server.api.generation import admitted, engine_of, engine_rows, served_model, submit, translated
from server.api.responses.background import (
    BackgroundRun,
    BackgroundRuns,
    fail_stale,
    heartbeat_seconds,
    resumed_events,
)
from server.api.responses.events import ResponseEvents, response_events
from server.api.responses.format import ResponseBuilder
from server.api.responses.ids import response_id
from server.api.responses.protocol import ResponsesRequest
from server.api.responses.replay import public
from server.api.responses.store import MAX_TURNS, UNFINISHED, ResponseStore, StoredResponse, page, too_long
from server.api.responses.stores import open_store
from server.api.responses.storing import check_room, failure_headers, keep
from server.api.responses.truncation import item_images, rendered
from server.http.auth import caller_of, require_api_key
from server.http.errors import APIError
from server.http.limits import CallerHold, caller_hold
from server.output.streaming import collect_all, until_disconnect
from server.output.tool_parser import PARSERS
from server.translate.structured import answer_after_thinking, reasoning_of

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


@asynccontextmanager
async def background_lifespan(app: FastAPI) -> AsyncIterator[None]:
    """At start-up, fail the background responses a stopped replica left unfinished; at shutdown, let
    this replica's runs end while the engine drains, then store the rest as failed."""
    settings = app.state.settings
    try:
        failed = await fail_stale(store_of(Request({"type": "http", "app": app})), settings.responses_lease)
        if failed:
            logger.warning("%d background responses whose replica stopped were stored as failed", failed)
    except Exception:  # an unreachable store fails its requests, not the start
        logger.exception("failing the stale background responses at start-up")
    try:
        yield
    finally:
        await runs_of(app).stop(settings.drain_timeout + 1)


router = APIRouter(dependencies=[Depends(require_api_key)], route_class=OneResourceRoute,
                   lifespan=background_lifespan)  # fmt: skip


def store_of(request: Request) -> ResponseStore:
    """The app's responses store, made on first use from ``--responses-store`` (SQLite or PostgreSQL: it
    connects on its first query; the app closes it at shutdown)."""
    store = getattr(request.app.state, "responses_store", None)
    if store is None:
        store = open_store(request.app.state.settings)
        request.app.state.responses_store = store
    return store


def owner_of(request: Request) -> str:
    """Whose responses a request sees: the digest of the key its auth checked when the server has keys
    (``auth.Caller``), else everyone's (""). A revoked key is refused before this: its rows are unreachable."""
    return caller_of(request).identity


def not_found(response_id: str, param: str) -> APIError:
    return APIError(404, f"No response found with id '{response_id}'", param=param, code="response_not_found")


def runs_of(app: FastAPI) -> BackgroundRuns:
    """The background responses this app runs (made on first use)."""
    runs = getattr(app.state, "responses_runs", None)
    if runs is None:
        runs = app.state.responses_runs = BackgroundRuns()
    return runs


async def stored(request: Request, response_id: str, param: str = "response_id") -> StoredResponse:
    """The caller's stored response; one left unfinished by a replica that stopped is failed first."""
    store, owner = store_of(request), owner_of(request)
    found = await store.get(response_id, owner)
    if found is None:
        raise not_found(response_id, param)
    if found.response["status"] in UNFINISHED and runs_of(request.app).get(response_id) is None:
        if await fail_stale(store, request.app.state.settings.responses_lease):
            found = await store.get(response_id, owner) or found
    return found


@router.post("/v1/responses")
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    client = engine_of(request)
    model = served_model(client, body.model)
    body, params = translated(request, client, body, max_model_len=client.max_model_len)
    params = answer_after_thinking(params, reasoning_of(request))  # a constraint shapes the answer, after the thinking
    earlier, earlier_bytes = await continued(request, body.previous_response_id)
    input_items = body.input_items()
    conversation = earlier + input_items
    settings = request.app.state.settings
    if body.store is not False:
        await check_room(store_of(request), owner_of(request), settings, earlier_bytes, input_items)
    images = await item_images(request, client, earlier, input_items)  # stored ones sent again: the same bytes
    prompt_ids, params = await rendered(client, body, params, conversation, images)
    params = await admitted(client, params, [prompt_ids], "input")
    tool_use = body.tool_use()
    offered = [tool.function.name for tool in tool_use.offered()] if tool_use else []
    parser = partial(PARSERS[request.app.state.settings.tool_call_parser], offered) if offered else None
    # a continuation keeps its conversation's routing tag in its id (ids.py): one replica per conversation
    builder = ResponseBuilder(response_id(body.previous_response_id), model, body.echo(),
                              logprobs=params.logprobs is not None, tool_parser=parser,
                              reasoning=reasoning_of(request))  # fmt: skip

    def row_of(response: dict[str, Any]) -> StoredResponse:
        return StoredResponse(response["id"], owner_of(request), response, input_items, body.previous_response_id,
                              earlier=earlier)  # fmt: skip

    async def kept(response: dict[str, Any]) -> dict[str, Any] | None:
        """None, or the store's failure the client is told of."""
        if body.store is False:
            return None
        return await keep(store_of(request), row_of(response), settings.responses_max_bytes)

    hold = caller_hold(request.scope.get("state", {}))
    if hold is not None:  # the caller's limit counts the rows this request will run
        hold.grow(engine_rows(params), "num_beams" if params.num_beams > 1 else "n")
    if body.background:  # its rows count against the caller until the run ends, not the request
        row = row_of({"id": builder.response_id})
        streams = await submit(request, client, row.id, [prompt_ids], params)
        return await start_background(request, body, builder, row, streams, hold and hold.handed_over())
    streams = await submit(request, client, builder.response_id, [prompt_ids], params)
    if body.stream:
        return EventSourceResponse(response_events(streams, ResponseEvents(builder), kept), ping=15)
    (collected,) = await until_disconnect(request, collect_all(streams))
    response = builder.body(collected)
    failed = await kept(response)
    return JSONResponse(response, headers=failure_headers(failed))


async def continued(request: Request, previous_id: str | None) -> tuple[list[dict[str, Any]], int]:
    """The conversation ``previous_response_id`` continues (every item, its output included) and the
    bytes its stored turns take; nothing without one."""
    if previous_id is None:
        return [], 0
    previous = await stored(request, previous_id, "previous_response_id")
    if previous.response.get("status") in UNFINISHED:  # its output is not there yet to continue from
        raise APIError(400, f"Previous response with id '{previous_id}' is still {previous.response['status']}; "
                       "continue it once it has finished", param="previous_response_id",
                       code="previous_response_not_finished")  # fmt: skip
    if previous.turns >= MAX_TURNS:
        raise too_long(previous_id)
    conversation = await store_of(request).conversation(previous_id, owner_of(request))
    if conversation is None:  # deleted since
        raise not_found(previous_id, "previous_response_id")
    return conversation.items, conversation.bytes


async def start_background(request: Request, body: ResponsesRequest, builder: ResponseBuilder, row: StoredResponse,
                           streams: list, hold: CallerHold | None = None) -> Response:  # fmt: skip
    """Store the response as queued and hand it to a task the app owns; answer with the queued object,
    or follow its events (a client that goes away stops reading, not the run)."""
    settings = request.app.state.settings
    row.response = builder.response("queued", [])
    try:
        await store_of(request).create(row)
    except BaseException:
        for stream in streams:
            await stream.aclose()  # nothing will run it: abort it in the engine
        if hold is not None:
            hold.release()
        raise
    run = BackgroundRun(row, ResponseEvents(builder), streams, store_of(request),
                        heartbeat=heartbeat_seconds(settings.responses_lease),
                        max_bytes=settings.responses_max_bytes)  # fmt: skip
    runs_of(request.app).start(run, hold)
    if body.stream:
        return EventSourceResponse(run.log.follow(), ping=15)
    return JSONResponse(row.response)


@router.get("/v1/responses/{response_id}")
async def retrieve_response(
    response_id: str,
    request: Request,
    stream: bool = False,
    starting_after: int | None = Query(default=None, ge=0),  # sequence numbers start at 0, as OpenAI's
) -> Response:
    """The stored response; with ``stream=true`` a background response's events after ``starting_after``
    (all of them without it), live until it ends."""
    found = await stored(request, response_id)
    if not stream:
        return JSONResponse(public(found.response))
    if not found.response.get("background"):
        raise APIError(400, "only a background response's events can be streamed again; retrieve this one "
                       "without stream", param="stream")  # fmt: skip
    lease = request.app.state.settings.responses_lease
    after = -1 if starting_after is None else starting_after
    return EventSourceResponse(resumed_events(runs_of(request.app), store_of(request), found, after, lease), ping=15)


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request) -> Response:
    """Abort a queued or in-progress background response, stored as cancelled with what it made; a
    finished one is returned unchanged."""
    found = await stored(request, response_id)
    if not found.response.get("background"):
        raise APIError(400, "Only background responses can be cancelled", param="response_id")
    runs = runs_of(request.app)
    run = runs.get(response_id)
    if run is not None:
        return JSONResponse(await runs.cancel(run))
    if found.response["status"] not in UNFINISHED:
        return JSONResponse(public(found.response))
    # running on another replica: stored as cancelled unless it finished first (then it is the answer);
    # its runner learns of the cancel at its next heartbeat and stops
    cancelled = {**public(found.response), "status": "cancelled"}
    found.response = cancelled
    if await store_of(request).update(found):
        return JSONResponse(cancelled)
    return JSONResponse(public((await stored(request, response_id)).response))


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> Response:
    runs = runs_of(request.app)
    run = runs.get(response_id)
    if run is not None and run.row.owner == owner_of(request):  # a deleted response stops running
        run.deleted = True
        await runs.cancel(run)
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
