"""Optional bearer-token auth for /v1/*: with an API key configured, requests must carry it."""

from __future__ import annotations

import hmac

from fastapi import Request

from server.errors import APIError


async def require_api_key(request: Request) -> None:
    expected = getattr(request.app.state.settings, "api_key", None)
    if not expected:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip(), expected):
        raise APIError(401, "Incorrect or missing API key; send 'Authorization: Bearer <key>'",
                       type_="authentication_error", code="invalid_api_key")  # fmt: skip
