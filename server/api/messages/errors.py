"""Errors on ``/v1/messages*`` in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}}``.

Anthropic's SDK reads this body (its exception's ``body``) and the HTTP status, which stays the one
every API answers (400, 401, 404, 413, 429, 500, 503); the message is the same text, naming the
parameter. Registered for the path prefix with ``server.http.errors``, so the middlewares' refusals
(body size, rate limit, API key) and an unknown path under it answer in it too; a stream's error is the
same body as an ``error`` event. The operations document this body (``MessagesErrorResponse``) instead
of OpenAI's.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from server.http.errors import APIError, register_error_shape

PREFIX = "/v1/messages"
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error", 529: "overloaded_error"}  # fmt: skip
DESCRIPTIONS = {"400": "a bad parameter or an unknown field, named in the message", "401": "a missing or wrong API key",
                "404": "an unknown model or path", "413": "the body is too large",
                "429": "the queue is full or the caller is over its limit (Retry-After)",
                "500": "a server bug", "503": "the model is loading or the server drains (Retry-After)"}  # fmt: skip


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def anthropic_error(error: APIError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(error.status), "message": error.message}}


register_error_shape(PREFIX, anthropic_error)


class MessagesErrorBody(BaseModel):
    type: str
    message: str


class MessagesErrorResponse(BaseModel):
    type: str
    error: MessagesErrorBody


def documented_errors(statuses: tuple[str, ...]) -> dict[int | str, dict[str, Any]]:
    """The operation's error answers for ``/openapi.json`` (FastAPI's ``responses``)."""
    documented: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        answer: dict[str, Any] = {"description": DESCRIPTIONS[status], "model": MessagesErrorResponse}
        if status in ("429", "503"):
            answer["headers"] = {"Retry-After": {"description": "seconds to wait", "schema": {"type": "string"}}}
        if status == "401":
            answer["headers"] = {"WWW-Authenticate": {"schema": {"type": "string"}}}
        documented[status] = answer
    return documented
