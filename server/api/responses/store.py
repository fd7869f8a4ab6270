"""Where stored responses live: one small interface (``ResponseStore``), behind it SQLite
(``store_sqlite``) or PostgreSQL (``store_postgres``), the same rules in both.

**A turn stores what it adds.** A row holds its response object, its request's own input items
(what ``input_items`` lists) and its output, and names the response it continues
(``previous_id``); a conversation is rebuilt by walking those names back to its first turn
(``conversation``: at most ``MAX_TURNS`` rows, items by reference, never copied into a later row).
So N turns of a conversation store N turns' items, not N conversations. A row written by schema
version 2, which copied the conversation into every row, keeps that copy (``conversation``) and is
the start of its chain. Deleting a response another one continues from hides it (``deleted``: as
absent as a row that never was) and keeps its items for the later turns; it goes with the last of
them. Every row of a conversation is kept while any of them is (its first turn's
``responses_conversations.keep_until``, moved by every write and heartbeat): a row past its time to
live reads as absent, and the whole conversation is deleted once all of it has.

**Writes cannot undo each other.** A response is inserted once (``create``); after that a write
(``update``: the runner's ``in_progress`` and final object, another replica's cancel) applies only
while the row is ``queued`` or ``in_progress`` and not deleted, so a delete or a cancel wins over a
runner that comes late, a finished response is never overwritten, and a deleted one stays deleted.
One write may follow a cancel made on another replica: its runner's own ``cancelled`` object, which
holds the output made until the cancel reached it. A running response's heartbeat writes a small
row of its own (``responses_leases``), never the response; a response reads as unfinished until its
runner's last write, whatever its time to live, and the heartbeat keeps its conversation from
expiring under it.

**Quota.** Each owner's stored bytes and items are counted as rows come and go
(``responses_usage``), for ``--responses-quota-bytes`` and ``--responses-quota-items``. Each row
names its owner, the digest of the key that created it ("" without API keys): a row read with
another owner is as absent as a row that never was.

Every write is one transaction: a failure leaves the row as it was. A store that cannot be reached,
or whose disk refuses a write, raises ``APIError`` 503 with ``Retry-After`` (``store_unavailable``),
and the next call tries again (a new connection), so the store comes back without a restart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from server.http.errors import APIError, unavailable

UNFINISHED = ("queued", "in_progress")
MAX_TURNS = 4096  # the longest chain of previous_response_id a conversation may have: its walk is bounded
EXPIRED_BATCH = 1000  # expired conversations one write deletes at most: reads skip the rest until later writes
UNAVAILABLE_CODE = "responses_store_unavailable"


@dataclass
class StoredResponse:
    id: str
    owner: str
    response: dict[str, Any]  # the response object, as the API returned it (its output included)
    input_items: list[dict[str, Any]]  # the request's own input items
    previous_id: str | None = None  # the response this one continues
    earlier: list[dict[str, Any]] | None = field(default=None, repr=False)  # its conversation before input_items:
    # written into the row only if ``previous_id`` is gone by the time it is created (deleted meanwhile)
    turns: int = 1  # rows in its conversation, itself included (read from the store)

    def size(self) -> tuple[int, int]:
        """(bytes, items) the row takes: its JSON, and its input and output items."""
        return row_size(self.response, self.input_items)


@dataclass
class Conversation:
    """A stored response's whole conversation: every item, its own output included, oldest first."""

    items: list[dict[str, Any]]
    bytes: int  # what its rows take (the cap on a conversation, ``--responses-max-bytes``)
    turns: int


class ResponseStore(Protocol):
    """What ``/v1/responses`` needs of a store; every read takes the caller's owner."""

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The row, or None when it is absent, deleted, expired or another owner's."""
        ...

    async def status(self, response_id: str, owner: str) -> str | None:
        """The row's status (no JSON read), or None as ``get``."""
        ...

    async def conversation(self, response_id: str, owner: str) -> Conversation | None:
        """The conversation a response continuing this one starts from (None as ``get``)."""
        ...

    async def usage(self, owner: str) -> tuple[int, int]:
        """(bytes, items) the owner's rows take, hidden and expired ones still kept included."""
        ...

    async def create(self, stored: StoredResponse) -> None:
        """Insert a new row (a finished response, or a background one as queued), continuing
        ``stored.previous_id``'s conversation when it names one."""
        ...

    async def update(self, stored: StoredResponse, runner: bool = False) -> bool:
        """Write ``stored.response`` (its status, output, expiry) if the row is still queued or in
        progress and not deleted; whether it was. The ``runner``'s writes: its final one ends its lease,
        and may also be the ``cancelled`` object (with the output made) over a cancel another replica
        stored while it ran; another replica's cancel leaves the lease to the runner."""
        ...

    async def delete(self, response_id: str, owner: str) -> bool:
        """Whether a row of that owner was there to delete."""
        ...

    async def heartbeat(self, response_id: str) -> str | None:
        """The runner of this unfinished response is alive: its lease is renewed and its conversation
        kept; returns the row's status (None: deleted or gone), so a runner learns of a cancel."""
        ...

    async def fail_stale(self, before: float, error: dict[str, Any]) -> int:
        """Every queued or in-progress row whose lease was last renewed before ``before`` (its replica
        stopped) becomes ``failed`` with ``response.error`` = ``error``; returns how many."""
        ...


def row_size(response: dict[str, Any], input_items: list[dict[str, Any]]) -> tuple[int, int]:
    """(bytes, items) of a row holding ``response`` and ``input_items``."""
    output = response.get("output") or []
    return len(json.dumps(response)) + len(json.dumps(input_items)), len(input_items) + len(output)


def without_output(response: dict[str, Any]) -> dict[str, Any]:
    """The response object as its column holds it: the output in its own column (its key kept, so the
    fields read back in their order)."""
    return {**response, "output": []} if "output" in response else response


def chained(rows: list[tuple[list[dict], list[dict], list[dict] | None]]) -> list[dict[str, Any]]:
    """A conversation from its rows' (input items, output, version-2 conversation), oldest first."""
    items: list[dict[str, Any]] = []
    for input_items, output, inline in rows:
        items = list(inline) if inline is not None else items + list(input_items)
        items += output
    return items


def too_long(response_id: str) -> APIError:
    return APIError(400, f"the conversation of response '{response_id}' has {MAX_TURNS} turns, the most one may "
                    "have; start a new one (send its items as input)", param="previous_response_id",
                    code="conversation_too_long")  # fmt: skip


def store_unavailable(where: str, exc: BaseException) -> APIError:
    """The 503 a store that cannot be reached or written answers; its message names the store."""
    return unavailable(f"the responses store ({where}) is unavailable: {type(exc).__name__}: {exc}",
                       code=UNAVAILABLE_CODE)  # fmt: skip


def page(items: list[dict[str, Any]], *, after: str | None, before: str | None, limit: int,
         order: str) -> dict[str, Any]:  # fmt: skip
    """OpenAI's list page over ``items`` (oldest first): ``data``, ``first_id``, ``last_id``, ``has_more``."""
    ordered = list(reversed(items)) if order == "desc" else list(items)
    ids = [item["id"] for item in ordered]
    start, end = 0, len(ordered)
    if after is not None:
        start = ids.index(after) + 1 if after in ids else len(ordered)
    if before is not None:
        end = ids.index(before) if before in ids else 0
    window = ordered[start:end]
    data = window[:limit] if before is None else window[-limit:]
    has_more = len(window) > len(data)
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}  # fmt: skip
