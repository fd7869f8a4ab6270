"""Per-request limits enforced before a handler runs: body size (413) and concurrency per API key (429).

Both are pure ASGI so that a stream is held, and counted, until its last byte is sent, and so
that an oversized body is refused from its ``Content-Length`` before any of it is read. A body
sent without a length (chunked) is counted as it arrives; the read that crosses the limit raises
a ``HTTPException`` subclass, which FastAPI passes through its body parser to the error handler.

The concurrency limit counts what one caller has open on ``/v1/*`` (streams until they end), in
engine rows: an HTTP request holds one as it arrives, and a generation request grows its hold to
the rows it will run (prompts × ``n``, or × ``num_beams`` for beam search, × 2 with guidance's
unconditional twin) before it reaches the engine, so one request with 128 prompts × ``n`` 64
cannot take what the limit gives a whole caller (``CallerHold.grow``). A background response's
rows stay counted until its run ends (``CallerHold.handed_over``): new generations count them,
polling or cancelling the response does not.

With API keys configured a caller is the key ``auth.Identify`` checked, never a header it did not
check (a valid ``x-api-key`` beside an invented bearer token is refused there, not counted as a new
caller); a request whose keys were refused is answered here (401, or 400 for two different keys)
before any of its body is read. Without keys, a bearer token proves nothing (anyone may send a
fresh one per request and so escape any limit), so a caller is its client address: behind a proxy
that is the proxy, and the limit acts as a cap for everything it forwards. Excess requests are
answered at once with 429 and ``Retry-After``, never queued: the engine's own queue
(``--max-queue``) is the place where work waits.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.http.auth import caller_in, unauthorized
from server.http.errors import APIError

API_PREFIX = "/v1/"
RETRY_CONCURRENCY = "1"  # seconds: a slot frees as soon as one of the key's own requests ends


class RequestTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body exceeds {limit} bytes (--max-request-bytes)")


def too_large(limit: int) -> APIError:
    return APIError(413, f"request body exceeds {limit} bytes (--max-request-bytes)", code="request_too_large")


@dataclass(frozen=True)
class UploadLimit:
    """A route whose body carries an upload (a multipart file) larger than a JSON body may be: its body may
    hold the upload's ``max_bytes`` plus ``--max-request-bytes`` for the other fields, and more is a 413
    naming the upload's field."""

    max_bytes: int  # the upload's own limit (0: none)
    param: str  # the form field that holds it
    flag: str  # the setting that sets max_bytes, as the error names it

    @classmethod
    def of(cls, settings: object, param: str, setting: str) -> UploadLimit:
        """The limit the setting named ``setting`` (``max_audio_bytes``) puts on the field ``param``."""
        return cls(getattr(settings, setting), param, "--" + setting.replace("_", "-"))

    def body_limit(self, max_request_bytes: int) -> int:
        return 0 if not self.max_bytes or not max_request_bytes else self.max_bytes + max_request_bytes

    def refused(self, size: int | None = None) -> APIError:
        sent = f" ({size} bytes)" if size is not None else ""
        return APIError(413, f"{self.param}{sent} exceeds {self.max_bytes} bytes ({self.flag})", param=self.param,
                        code="request_too_large")  # fmt: skip


def _header(scope: Scope, name: bytes) -> str | None:
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == name), None)


def caller_key(scope: Scope, keyed: bool = True) -> str | None:
    """Who a request counts against: with API keys, the identity ``auth.Identify`` decided (a digest of
    the key it checked, never the key itself; None: its keys were refused, nothing to count); without
    them, its client address."""
    if not keyed:
        client = scope.get("client")
        return f"address {client[0]}" if client else "anonymous"
    caller = caller_in(scope)
    return None if caller is None or caller.refused is not None else caller.identity


class CallerHold:
    """What one HTTP request holds of its caller's limit; the route grows it to the request's rows."""

    def __init__(self, open_: Counter[str], key: str, limit: int, detached: Counter[str] | None = None) -> None:
        """``open_``: rows of the caller's requests in flight; ``detached``: rows of work that outlived
        its request (background responses), which new generations count but polling them does not."""
        self.open, self.key, self.limit = open_, key, limit
        self.detached = Counter() if detached is None else detached
        self.held = 0

    def take(self, amount: int) -> None:
        self.open[self.key] += amount
        self.held += amount

    def grow(self, total: int, param: str) -> None:
        """Hold ``total`` rows in all, or refuse: 400 if no caller could ever run that many, 429 if
        this caller's other requests hold the rest."""
        if not self.limit:
            return
        if total > self.limit:
            raise APIError(400, f"this request runs {total} engine rows (prompts x n, or x num_beams); at most "
                           f"{self.limit} per caller (--max-concurrency-per-key)", param=param,
                           code="concurrency_limit")  # fmt: skip
        others = self.open[self.key] - self.held + self.detached[self.key]
        if others + total > self.limit:
            raise over_limit(self.limit, f"this request needs {total} engine rows and this caller holds "
                             f"{others}")  # fmt: skip
        if total > self.held:
            self.take(total - self.held)

    def handed_over(self) -> CallerHold:
        """The rows this request holds, moved to work that outlives it (a background response): the
        middleware's release at the request's end frees nothing, the new owner releases them."""
        kept = CallerHold(self.detached, self.key, self.limit, self.detached)
        kept.take(self.held)
        self.release()
        return kept

    def release(self) -> None:
        self.open[self.key] -= self.held
        self.held = 0
        if self.open[self.key] <= 0:
            del self.open[self.key]


def over_limit(limit: int, detail: str = "") -> APIError:
    return APIError(429, f"too many concurrent requests for this caller (limit {limit} engine rows, "
                    f"--max-concurrency-per-key){'; ' + detail if detail else ''}; retry when one ends",
                    type_="rate_limit_error", code="concurrency_limit",
                    headers={"Retry-After": RETRY_CONCURRENCY})  # fmt: skip


def caller_hold(scope_state: dict) -> CallerHold | None:
    """The hold the limits middleware put on this request (None when it did not run)."""
    return scope_state.get("caller_hold")


class RequestLimits:
    """413 for bodies over ``max_request_bytes``; 429 past ``max_concurrency_per_key`` (0: no limit)."""

    def __init__(self, app: ASGIApp, max_request_bytes: int, max_concurrency_per_key: int, keyed: bool = True,
                 uploads: dict[str, UploadLimit] | None = None) -> None:  # fmt: skip
        """``keyed``: the server checks API keys (a caller is its key, else its client address); ``uploads``:
        the paths whose bodies carry a file, and its limit."""
        self.app = app
        self.uploads = uploads or {}
        self.keyed = keyed
        self.max_request_bytes = max_request_bytes
        self.max_concurrency_per_key = max_concurrency_per_key
        self.open: Counter[str] = Counter()
        self.detached: Counter[str] = Counter()  # background responses' rows, by caller

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(API_PREFIX):
            await self.app(scope, receive, send)
            return
        upload = self.uploads.get(scope["path"])
        limit = self.max_request_bytes if upload is None else upload.body_limit(self.max_request_bytes)
        length = _header(scope, b"content-length")
        if limit and length is not None and length.isdigit() and int(length) > limit:
            refusal = too_large(limit) if upload is None else upload.refused()
            await refusal.response()(scope, receive, send)
            return
        key = caller_key(scope, self.keyed)
        if key is None:  # refused keys: every /v1/* route needs one; answered before any body is read
            caller = caller_in(scope)
            await (caller.refused if caller and caller.refused else unauthorized()).response()(scope, receive, send)
            return
        if self.max_concurrency_per_key and self.open[key] >= self.max_concurrency_per_key:
            await over_limit(self.max_concurrency_per_key).response()(scope, receive, send)
            return
        received = 0

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request" and limit:
                received += len(message.get("body", b""))
                if received > limit:
                    raise RequestTooLarge(limit)
            return message

        hold = CallerHold(self.open, key, self.max_concurrency_per_key, self.detached)
        hold.take(1)
        scope.setdefault("state", {})["caller_hold"] = hold
        try:
            await self.app(scope, counted_receive, send)
        finally:
            hold.release()
