"""What creating a stored response asks of the store: room before generating (the conversation cap
and the caller's quota), and keeping the finished response, whose client gets it even when the store
cannot take it.

Before any work: a conversation (its stored turns and this input) over ``--responses-max-bytes`` is
a 400 naming ``input``; an owner whose stored responses already hold ``--responses-quota-bytes``
bytes or ``--responses-quota-items`` items (this input counted) is a 429 naming the quota, with what
is used and the limit: the owner deletes responses, or waits for ``--responses-ttl``, or sends
``store: false``. A response that starts under the quota is stored whole (it passes the quota by at
most its own size).

After the work: a store that fails to take the response (its disk full or read-only, the database
gone or refusing the row) does not take the answer with it. The client gets the response with
``store: false``; a body's answer names the failure in the ``x-decoda-store-error`` header, a
stream in an ``error`` event (``param: "store"``) just before its final event; the log says it too.
The write is one transaction, so nothing of the row is left half-written.
"""

from __future__ import annotations

import logging
from typing import Any

from server.api.responses.store import ResponseStore, StoredResponse
from server.config.settings import Settings
from server.http.errors import APIError

logger = logging.getLogger(__name__)

STORE_ERROR_HEADER = "x-decoda-store-error"
QUOTAS = (("responses_quota_bytes", "--responses-quota-bytes", "bytes"),
          ("responses_quota_items", "--responses-quota-items", "items"))  # fmt: skip


async def check_room(store: ResponseStore, owner: str, settings: Settings, conversation_bytes: int,
                     input_items: list[dict[str, Any]]) -> None:  # fmt: skip
    """The 400 of a conversation over the cap, or the 429 of an owner over a quota, before generating."""
    adding = StoredResponse("", owner, {"output": []}, input_items).size()
    cap = settings.responses_max_bytes
    if cap and conversation_bytes + adding[0] > cap:
        raise APIError(400, f"the conversation is larger than a stored response may continue ({cap} bytes, "
                       "--responses-max-bytes); start a new one or send store: false", param="input",
                       code="conversation_too_large")  # fmt: skip
    limits = [getattr(settings, name) for name, _, _ in QUOTAS]
    if not any(limits):
        return
    used = await store.usage(owner)
    for (name, flag, unit), limit, held, more in zip(QUOTAS, limits, used, adding, strict=True):
        if limit and held + more > limit:
            raise APIError(429, f"the stored responses of this caller hold {held} {unit}; this request's input adds "
                           f"{more}, over the quota of {limit} ({flag}); delete stored responses "
                           "(DELETE /v1/responses/{id}), or send store: false", type_="insufficient_quota",
                           param=name, code="responses_quota_exceeded")  # fmt: skip


def store_failure(exc: Exception, response_id: str) -> dict[str, Any]:
    """The ``error`` a client is told of when its response could not be stored (``param``: store)."""
    reason = exc.message if isinstance(exc, APIError) else f"{type(exc).__name__}: {exc}"
    code = exc.code if isinstance(exc, APIError) and exc.code else "responses_store_failed"
    return {"code": code, "message": f"response {response_id} was generated but not stored: {reason}",
            "param": "store"}  # fmt: skip


async def keep(store: ResponseStore, row: StoredResponse, cap: int) -> dict[str, Any] | None:
    """Store a finished response; None, or the failure its client is told of (the response then says
    ``store: false``, as one over ``--responses-max-bytes`` does, which is logged and not stored)."""
    size = row.size()[0]
    if cap and size > cap:
        logger.warning("response %s is %d bytes, over --responses-max-bytes: not stored", row.id, size)
        row.response["store"] = False
        return None
    try:
        await store.create(row)
    except Exception as exc:  # the answer is made: it goes out whatever the store says
        logger.error("response %s was answered but not stored: %s", row.id, exc, exc_info=not isinstance(exc, APIError))
        row.response["store"] = False
        return store_failure(exc, row.id)
    return None


def failure_headers(failure: dict[str, Any] | None) -> dict[str, str]:
    """The header naming a store failure on a body's answer (ASCII, one line), or none."""
    if failure is None:
        return {}
    text = f"{failure['code']}: {failure['message']}"
    return {STORE_ERROR_HEADER: " ".join(text.encode("ascii", "replace").decode().split())}
