"""Every error leaves in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Handlers map validation problems to 400 naming the field (a nested one by its path, as the client
wrote it: ``messages[1].content[0].foo``), unknown models to 404, a full queue to 429 with
``Retry-After``, a stopped or dead engine to 503 with ``Retry-After``, and anything unexpected to a
500 that names the request id without leaking a traceback.

An API whose clients read another shape (Anthropic's Messages API) registers it for its paths
(``register_error_shape``); every error answer is an ``ErrorResponse``, which picks the shape from the
path it is sent on, so the handlers and the middlewares that refuse before any route (body size, rate
limits, API keys) answer each API's clients in their own shape without knowing which API it is.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from decoding import EngineUnavailableError, ParameterError, QueueFullError, RequestOutput

logger = logging.getLogger(__name__)

RETRY_UNAVAILABLE = "5"  # seconds; another replica (or this one, restarted) can take the request


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return ErrorResponse(self)


ErrorShape = Callable[[APIError], dict]
_ERROR_SHAPES: dict[str, ErrorShape] = {}  # path prefix -> the body its clients read


def register_error_shape(prefix: str, shape: ErrorShape) -> None:
    """Errors on ``prefix`` and the paths under it leave as ``shape(error)`` instead of OpenAI's body."""
    _ERROR_SHAPES[prefix.rstrip("/")] = shape


def error_shape_of(path: str) -> ErrorShape | None:
    """The shape registered for ``path`` (None: OpenAI's)."""
    return next((shape for prefix, shape in _ERROR_SHAPES.items() if path == prefix or path.startswith(prefix + "/")),
                None)  # fmt: skip


class ErrorResponse(JSONResponse):
    """An error's answer, its body in the shape of the path it is sent on: decided when it is sent,
    since a middleware makes it before any route is known."""

    def __init__(self, error: APIError) -> None:
        self.error = error
        super().__init__(error.body(), status_code=error.status, headers=error.headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        shape = error_shape_of(scope.get("path", ""))
        if shape is not None:
            self.body = self.render(shape(self.error))
            self.headers["content-length"] = str(len(self.body))
        await super().__call__(scope, receive, send)


def from_exception(exc: Exception, request_id: str | None = None) -> APIError:
    """The API error a known engine exception stands for; a 500 naming the request for the rest."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ParameterError):
        status = 404 if exc.code == "model_not_found" else 400
        return APIError(status, exc.message, param=exc.param, code=exc.code)
    if isinstance(exc, QueueFullError):
        retry = str(max(1, round(exc.retry_after)))
        return APIError(429, str(exc), type_="rate_limit_error", code="queue_full", headers={"Retry-After": retry})
    if isinstance(exc, EngineUnavailableError):
        return unavailable(str(exc))
    request_id = request_id or f"req-{uuid.uuid4().hex[:12]}"
    logger.exception("request %s failed", request_id, exc_info=exc)
    return APIError(500, f"internal error while serving request {request_id}", type_="server_error", code="internal")


def unavailable(message: str, code: str = "unavailable") -> APIError:
    return APIError(503, message, type_="service_unavailable", code=code, headers={"Retry-After": RETRY_UNAVAILABLE})


def from_output(output: RequestOutput) -> APIError:
    """The error a failed engine output stands for: 503 when the server stopped under it, 400 when the
    request's own knobs broke it, else a 500."""
    message = output.error or f"request {output.request_id} failed"
    if output.error_code == "unavailable":
        return unavailable(message)
    if output.error_code == "invalid_request":
        return APIError(400, message, code="invalid_request")
    return APIError(500, message, type_="server_error", code="internal")


# what pydantic names a union's branch with in a location (``str``, ``list[TextPart]``, ``literal[...]``,
# ``NamedToolChoice``, ``function-after[...]``): never a field the client sent
_TYPE_LABELS = frozenset({"str", "int", "float", "bool", "bytes", "dict", "list", "tuple", "set", "none"})


def _is_branch_label(part: str) -> bool:
    return part in _TYPE_LABELS or not part[:1].islower() or any(mark in part for mark in "[-(")


def _field_parts(loc: tuple) -> list[str | int]:
    """The location as the client wrote it: FastAPI's leading ``body`` (or ``query``: a query parameter is
    named as in the URL, ``starting_after``) and union branches dropped."""
    parts = list(loc[1:] if loc[:1] in (("body",), ("query",)) else loc)
    return [part for part in parts if isinstance(part, int) or not _is_branch_label(str(part))]


def _field_name(loc: tuple) -> str | None:
    """``top_p``; ``messages[1].content[0].foo`` for a nested field (None: the body itself)."""
    path = ""
    for part in _field_parts(loc):
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path or None


def _most_specific(errors: list[dict]) -> dict:
    """The first error or, when a union's branches all failed on that same field, the branch that got
    deepest (a text part's unknown ``foo``, not "content should be a string")."""
    top = _field_parts(tuple(errors[0].get("loc", ())))[:1]
    same_field = [e for e in errors if _field_parts(tuple(e.get("loc", ())))[:1] == top]
    return max(same_field, key=lambda e: len(_field_parts(tuple(e.get("loc", ())))))  # the first of the deepest


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    if not errors:
        return APIError(400, "invalid request body")
    first = _most_specific(list(errors))
    field = _field_name(tuple(first.get("loc", ())))
    kind = first.get("type", "")
    if kind == "json_invalid":
        return APIError(400, f"malformed JSON body: {first.get('msg')}", code="invalid_json")
    if kind == "extra_forbidden":
        return APIError(400, f"Unrecognized request argument supplied: {field}", param=field, code="unknown_field")
    if kind == "missing" and field is None:
        return APIError(400, "the request body is missing: send a JSON object", code="invalid_json")
    if kind == "missing":
        return APIError(400, f"missing required field: {field}", param=field, code="missing_field")
    if field is None and kind in ("model_attributes_type", "dict_type"):
        return APIError(400, "the request body must be a JSON object", code="invalid_json")
    message = first.get("msg", "invalid value")
    if "ctx" in first and isinstance(first["ctx"].get("error"), ParameterError):
        error = first["ctx"]["error"]
        if error.param is None and field is not None:  # raised by a validator that cannot know where it sits
            return APIError(400, f"{field}: {error.message}", param=field, code=error.code)
        return APIError(400, error.message, param=error.param or field, code=error.code)
    value = first.get("input")
    try:
        shown = json.dumps(value)[:80]
    except (TypeError, ValueError):
        shown = repr(value)[:80]
    return APIError(400, f"{field}: {message}, got {shown}", param=field, code="invalid_value")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc).response()

    @app.exception_handler(ParameterError)
    async def _parameter(_: Request, exc: ParameterError) -> JSONResponse:
        return from_exception(exc).response()

    @app.exception_handler(QueueFullError)
    async def _queue_full(_: Request, exc: QueueFullError) -> JSONResponse:
        return from_exception(exc).response()

    @app.exception_handler(EngineUnavailableError)
    async def _unavailable(_: Request, exc: EngineUnavailableError) -> JSONResponse:
        return from_exception(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {404: "not_found", 413: "request_too_large"}.get(exc.status_code, "http_error")
        return APIError(exc.status_code, str(exc.detail), code=kind, headers=exc.headers).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return from_exception(exc, getattr(request.state, "request_id", None)).response()
