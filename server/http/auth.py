"""Optional API-key auth, and the one caller identity every request carries.

A key is sent as ``Authorization: Bearer <key>`` (OpenAI's clients) or as ``x-api-key: <key>``
(Anthropic's, which also send ``anthropic-version``), on every route, as vLLM accepts both.

Keys come from ``Settings.api_keys()`` (``--api-key``, repeatable; ``DECODA_API_KEY``,
comma-separated; ``--api-keys-file``; ``--admin-api-key``, whose keys are API keys too), read once
when the app is built: removing a key from them and restarting revokes it. The check compares each
key sent against every key in constant time (SHA-256 digests through ``hmac.compare_digest``, with
no early exit), so neither which key matched nor a key's length leaks through timing.

``Identify`` decides who a request is once, before anything counts or logs it (``Caller``): the
digest of the key that was checked, never a header that was not. A request whose headers hold no
key, or any wrong one (a valid ``x-api-key`` beside an invented bearer token included) is refused
with 401, as vLLM refuses a wrong key in either header; two valid but different keys are a 400
(which of them is the caller would be a guess). The per-key limits (``limits``), the owner of a
stored response and the access log all read that one identity, so a key that was never checked
can neither escape a limit nor reach another key's responses.

``/health`` and ``/ready`` are always open; ``/metrics`` needs a key only with ``--protect-metrics``;
the API's description (``/docs``, ``/redoc``, ``/openapi.json``: every knob, model name and limit)
needs one unless ``--public-docs`` (the playground sends its key when it reads ``/openapi.json``).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field

from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from server.http.errors import APIError

METRICS_PATH = "/metrics"
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
CALLER_STATE = "caller"


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


def key_digests(keys: list[str]) -> list[bytes]:
    return [_digest(k.encode()) for k in keys]


def _sent_digest(key: str) -> bytes:
    # header values arrive decoded as latin-1: encoding back gives the bytes that were sent
    return _digest(key.strip().encode("latin-1", errors="replace"))


def _one_of(candidate: bytes, digests: list[bytes]) -> bool:
    """Whether ``candidate`` is one of ``digests``; looks at every one every time."""
    matched = False
    for digest in digests:
        matched |= hmac.compare_digest(candidate, digest)
    return matched


def key_matches(key: str, digests: list[bytes]) -> bool:
    """Whether ``key`` is one of the keys; looks at every key every time."""
    return _one_of(_sent_digest(key), digests)


def token_matches(authorization: str, digests: list[bytes]) -> bool:
    """Whether an ``Authorization`` header carries one of the keys as a bearer token."""
    scheme, _, token = authorization.partition(" ")
    return key_matches(token, digests) and scheme.lower() == "bearer"


@dataclass(frozen=True)
class KeyRing:
    """The server's keys as digests: every accepted one (admin keys included), and the admin ones."""

    digests: list[bytes] = field(default_factory=list)
    admin: list[bytes] = field(default_factory=list)

    @classmethod
    def of(cls, keys: list[str], admin_keys: list[str]) -> KeyRing:
        return cls(key_digests(keys), key_digests(admin_keys))


@dataclass(frozen=True)
class Caller:
    """Who a request is. ``identity``: the hex SHA-256 digest of the key that was checked ("" when the
    server has no keys, or when they were refused); ``refused``: why the keys sent were not accepted."""

    identity: str = ""
    admin: bool = False
    refused: APIError | None = None


def unauthorized(detail: str = "") -> APIError:
    return APIError(401, "Incorrect or missing API key; send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
                    + (f" ({detail})" if detail else ""), type_="authentication_error", code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"})  # fmt: skip


def _offered(authorization: str | None, x_api_key: str | None) -> list[tuple[str, str]]:
    """The keys a request sends, by header: a bearer token (another ``Authorization`` scheme is not
    one of ours) and ``x-api-key``; blank ones are none."""
    offered = []
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        offered.append(("Authorization", token))
    if x_api_key is not None and x_api_key.strip():
        offered.append(("x-api-key", x_api_key))
    return offered


def identify(authorization: str | None, x_api_key: str | None, keys: KeyRing) -> Caller:
    """The request's ``Caller`` from its two key headers (module docstring: 401, 400, or one identity)."""
    if not keys.digests:
        return Caller()
    checked = [(header, _sent_digest(key)) for header, key in _offered(authorization, x_api_key)]
    valid = [(header, digest, _one_of(digest, keys.digests)) for header, digest in checked]
    if not valid:
        return Caller(refused=unauthorized())
    wrong = [header for header, _, ok in valid if not ok]
    if wrong:
        return Caller(refused=unauthorized(f"the key in {wrong[0]} is not valid"))
    if len({digest for _, digest, _ in valid}) > 1:
        return Caller(refused=APIError(400, "the request sends two different API keys, one in 'Authorization' and "
                                       "one in 'x-api-key'; send one key (or the same key in both)",
                                       code="conflicting_api_keys"))  # fmt: skip
    digest = valid[0][1]
    return Caller(digest.hex(), admin=_one_of(digest, keys.admin))


def _scope_header(scope: Scope, name: bytes) -> str | None:
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == name), None)


def caller_in(scope: Scope) -> Caller | None:
    """The caller ``Identify`` put on this request (None when it did not run)."""
    return scope.get("state", {}).get(CALLER_STATE)


class Identify:
    """Pure ASGI: decide each HTTP request's ``Caller`` once, before the limits, routes and logs read it."""

    def __init__(self, app: ASGIApp, keys: KeyRing) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            caller = identify(_scope_header(scope, b"authorization"), _scope_header(scope, b"x-api-key"), self.keys)
            scope.setdefault("state", {})[CALLER_STATE] = caller
        await self.app(scope, receive, send)


def caller_of(request: Request) -> Caller:
    """This request's caller (decided by ``Identify``; decided here for an app built without it)."""
    caller = caller_in(request.scope)
    if caller is None:
        keys = getattr(request.app.state, "keys", None) or KeyRing()
        caller = identify(request.headers.get("authorization"), request.headers.get("x-api-key"), keys)
    return caller


async def require_api_key(request: Request) -> None:
    refused = caller_of(request).refused
    if refused is not None:
        raise refused


async def require_admin_key(request: Request) -> None:
    """An API key, and with keys configured one of ``--admin-api-key``'s (a 403 naming why otherwise)."""
    caller = caller_of(request)
    if caller.refused is not None:
        raise caller.refused
    keys = getattr(request.app.state, "keys", None) or KeyRing()
    if keys.digests and not caller.admin:
        raise APIError(403, f"{request.url.path} needs an admin API key (--admin-api-key); this key may call the "
                       "model but not change which adapters the server loads", type_="permission_error",
                       code="admin_key_required")  # fmt: skip


class ProtectPaths:
    """Pure ASGI guard: these paths need one of the keys (``/metrics`` with ``--protect-metrics``,
    the API description without ``--public-docs``). Inside ``Identify``."""

    def __init__(self, app: ASGIApp, keys: KeyRing, paths: frozenset[str]) -> None:
        self.app = app
        self.keys = keys
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in self.paths and self.keys.digests:
            caller = caller_in(scope) or identify(_scope_header(scope, b"authorization"),
                                                  _scope_header(scope, b"x-api-key"), self.keys)  # fmt: skip
            if caller.refused is not None:
                await caller.refused.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def protected_paths(protect_metrics: bool, public_docs: bool) -> frozenset[str]:
    """The open paths that need a key when the server has keys."""
    return (frozenset({METRICS_PATH}) if protect_metrics else frozenset()) | (
        frozenset() if public_docs else DOCS_PATHS
    )
