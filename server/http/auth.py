"""Optional API-key auth: with API keys configured, /v1/* requests must carry one of them.

A key is sent as ``Authorization: Bearer <key>`` (OpenAI's clients) or as ``x-api-key: <key>``
(Anthropic's, which also send ``anthropic-version``), on every route, as vLLM accepts both.

Keys come from ``Settings.api_keys()`` (``--api-key``, repeatable; ``DECODA_API_KEY``,
comma-separated; ``--api-keys-file``), read once when the app is built. The check compares the
token against every key in constant time (SHA-256 digests through ``hmac.compare_digest``, with no
early exit), so neither which key matched nor a key's length leaks through timing. ``/health`` and
``/ready`` are always open; ``/metrics`` needs a key only with ``--protect-metrics``; the API's
description (``/docs``, ``/redoc``, ``/openapi.json``: every knob, model name and limit) needs one
unless ``--public-docs`` (the playground sends its key when it reads ``/openapi.json``).
"""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from server.http.errors import APIError

METRICS_PATH = "/metrics"
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


def key_digests(keys: list[str]) -> list[bytes]:
    return [_digest(k.encode()) for k in keys]


def key_matches(key: str, digests: list[bytes]) -> bool:
    """Whether ``key`` is one of the keys; looks at every key every time."""
    # header values arrive decoded as latin-1: encoding back gives the bytes that were sent
    candidate = _digest(key.strip().encode("latin-1", errors="replace"))
    matched = False
    for digest in digests:
        matched |= hmac.compare_digest(candidate, digest)
    return matched


def token_matches(authorization: str, digests: list[bytes]) -> bool:
    """Whether an ``Authorization`` header carries one of the keys as a bearer token."""
    scheme, _, token = authorization.partition(" ")
    return key_matches(token, digests) and scheme.lower() == "bearer"


def request_has_key(authorization: str | None, x_api_key: str | None, digests: list[bytes]) -> bool:
    """Whether the request's ``Authorization: Bearer`` or its ``x-api-key`` holds one of the keys
    (both are compared, whichever is sent)."""
    bearer = token_matches(authorization or "", digests)
    header = key_matches(x_api_key, digests) if x_api_key is not None else False
    return bearer or header


def unauthorized() -> APIError:
    return APIError(401, "Incorrect or missing API key; send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                    type_="authentication_error", code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"})  # fmt: skip


async def require_api_key(request: Request) -> None:
    digests = getattr(request.app.state, "api_key_digests", None)
    if not digests:
        return
    if not request_has_key(request.headers.get("authorization"), request.headers.get("x-api-key"), digests):
        raise unauthorized()


class ProtectPaths:
    """Pure ASGI guard: these paths need one of the keys (``/metrics`` with ``--protect-metrics``,
    the API description without ``--public-docs``)."""

    def __init__(self, app: ASGIApp, digests: list[bytes], paths: frozenset[str]) -> None:
        self.app = app
        self.digests = digests
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in self.paths and self.digests:
            headers = {k: v.decode("latin-1") for k, v in scope["headers"] if k in (b"authorization", b"x-api-key")}
            if not request_has_key(headers.get(b"authorization"), headers.get(b"x-api-key"), self.digests):
                await unauthorized().response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def protected_paths(protect_metrics: bool, public_docs: bool) -> frozenset[str]:
    """The open paths that need a key when the server has keys."""
    return (frozenset({METRICS_PATH}) if protect_metrics else frozenset()) | (
        frozenset() if public_docs else DOCS_PATHS
    )
