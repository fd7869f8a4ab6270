"""Request ids and access logs: one line per request, written when its response has ended.

``X-Request-Id`` from the caller (or the load balancer) is kept when it is a plain token (up to 128
characters of letters, digits and ``._:@/+=-``); anything else, or none, gets a fresh id. The id
goes back in the response header, into ``request.state.request_id`` (a 500 names it) and into the
access line. The line is written at the end, not when the status is sent, so a stream's duration
is the whole stream. The line names the caller by the start of its key's digest (the identity
``auth.Identify`` checked; never the key). uvicorn's own access log is turned off (``decoda serve`` passes
``access_log=False``): it logs at the first byte and knows no request id.

``--log-format json`` renders every record, access lines and uvicorn's own, as one JSON object
per line with the access fields as keys, for log shippers that index them.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.http.auth import caller_in

access_logger = logging.getLogger("decoda.access")
REQUEST_ID_HEADER = b"x-request-id"
VALID_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")
ACCESS_FIELDS = ("request_id", "client", "caller", "method", "path", "status", "duration_ms", "response_bytes")
CALLER_SHOWN = 12  # hex digits of a caller's key digest in the log: tells keys apart, never the key


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def printable(text: str) -> str:
    """``text`` with every control character escaped (``\\x0a``): a decoded ``%0a`` in a URL must
    not start a forged log line in the text format, nor a raw control character reach a log reader."""
    return _UNPRINTABLE.sub(lambda match: _escape(ord(match.group())), text)


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def request_id_of(scope: Scope) -> str:
    given = next((v.decode("latin-1") for k, v in scope["headers"] if k == REQUEST_ID_HEADER), "")
    return given if VALID_REQUEST_ID.fullmatch(given) else uuid.uuid4().hex


def caller_shown(scope: Scope) -> str:
    """Who the line is about: ``key:`` and the start of the checked key's digest (``auth.Caller``, the same
    identity the limits and stored responses use), ``refused`` for keys that were not accepted, ``-`` on
    a server without keys."""
    caller = caller_in(scope)
    if caller is None or (not caller.identity and caller.refused is None):
        return "-"
    return "refused" if caller.refused is not None else f"key:{caller.identity[:CALLER_SHOWN]}"


class AccessLog:
    """Pure ASGI: adds ``x-request-id`` to the response and logs the request when it ends."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope)
        scope.setdefault("state", {})["request_id"] = request_id
        started = time.perf_counter()
        status = 500  # what the client sees if the app raises before answering
        sent = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []),
                                                  (REQUEST_ID_HEADER, request_id.encode("latin-1"))]}  # fmt: skip
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            client = scope.get("client")
            fields = {
                "request_id": request_id,
                "client": printable(f"{client[0]}:{client[1]}") if client else "-",
                "caller": caller_shown(scope),
                "method": printable(scope["method"]),
                "path": printable(scope["path"]),
                "status": status,
                "duration_ms": round((time.perf_counter() - started) * 1000, 1),
                "response_bytes": sent,
            }
            access_logger.info('%s "%s %s" %d %.1f ms %d bytes request_id=%s caller=%s', fields["client"],
                               fields["method"], fields["path"], status, fields["duration_ms"], sent, request_id,
                               fields["caller"], extra=fields)  # fmt: skip


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and the access fields when present."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({name: getattr(record, name) for name in ACCESS_FIELDS if hasattr(record, name)})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str, log_format: str) -> None:
    """The root handler for every logger (uvicorn's propagate to it: ``decoda serve`` gives uvicorn no
    log config of its own)."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
