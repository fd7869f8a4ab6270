"""``decoda_http_requests_total``: every response counted by route template and status, refusals included."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.http.metrics import Metrics


class CountResponses:
    """Pure ASGI middleware counting each response by route template and status
    (``decoda_http_requests_total``). It only watches ``http.response.start`` and passes every
    message straight on, so SSE streams are never buffered."""

    def __init__(self, app: ASGIApp, metrics: Metrics, fastapi_app: FastAPI) -> None:
        self.app = app
        self.metrics = metrics
        self.fastapi_app = fastapi_app
        self.known_paths: frozenset[str] | None = None

    def route_of(self, scope: Scope) -> str:
        path = getattr(scope.get("route"), "path", None)  # set by FastAPI's router once a route matched
        if path:
            return path
        # answered before routing (the /metrics guard's 401): a fixed path of the API's names itself;
        # never any other raw path, so unknown URLs cannot grow the label set
        if self.known_paths is None:
            self.known_paths = frozenset(self.fastapi_app.openapi().get("paths", {}))
        return scope["path"] if scope["path"] in self.known_paths else "unmatched"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def counting_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                self.metrics.on_response(self.route_of(scope), message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except Exception:
            if not started:  # the outer error middleware answers 500 after us
                self.metrics.on_response(self.route_of(scope), 500)
            raise
