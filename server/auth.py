"""Optional bearer-token auth: with API keys configured, /v1/* requests must carry one of them.

Keys come from ``Settings.api_keys()`` (``--api-key``, repeatable; ``DECODA_API_KEY``,
comma-separated; ``--api-keys-file``), read once when the app is built. The check compares the
token against every key in constant time (SHA-256 digests through ``hmac.compare_digest``, with no
early exit), so neither which key matched nor a key's length leaks through timing. ``/health`` and
``/ready`` are always open; ``/metrics`` needs a key only with ``--protect-metrics``.
"""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from server.errors import APIError

METRICS_PATH = "/metrics"


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


def key_digests(keys: list[str]) -> list[bytes]:
    return [_digest(k.encode()) for k in keys]


def token_matches(authorization: str, digests: list[bytes]) -> bool:
    """Whether an ``Authorization`` header carries one of the keys; looks at every key every time."""
    scheme, _, token = authorization.partition(" ")
    # header values arrive decoded as latin-1: encoding back gives the bytes that were sent
    candidate = _digest(token.strip().encode("latin-1", errors="replace"))
    matched = False
    for digest in digests:
        matched |= hmac.compare_digest(candidate, digest)
    return matched and scheme.lower() == "bearer"


def unauthorized() -> APIError:
    return APIError(401, "Incorrect or missing API key; send 'Authorization: Bearer <key>'",
                    type_="authentication_error", code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"})  # fmt: skip


async def require_api_key(request: Request) -> None:
    digests = getattr(request.app.state, "api_key_digests", None)
    if not digests:
        return
    if not token_matches(request.headers.get("authorization", ""), digests):
        raise unauthorized()


class ProtectMetrics:
    """Pure ASGI guard: ``GET /metrics`` needs one of the keys (used with ``--protect-metrics``)."""

    def __init__(self, app: ASGIApp, digests: list[bytes]) -> None:
        self.app = app
        self.digests = digests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == METRICS_PATH and self.digests:
            authorization = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), "")
            if not token_matches(authorization, self.digests):
                await unauthorized().response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
