"""Where stored responses live: one small interface (``ResponseStore``), SQLite behind it.

A stored response is its response object, its own input items (what ``input_items`` lists) and its
conversation: every item before its output, earlier turns included, so continuing it with
``previous_response_id`` is one read, and deleting an earlier turn never breaks a later one. Each
row names its owner, the SHA-256 digest of the bearer token that created it ("" without API keys):
a row read with another owner is as absent as a row that never was.

SQLite through Python's own ``sqlite3``: one connection, used under a lock from worker threads
(``asyncio.to_thread``), so the event loop never waits on the disk; WAL mode so readers of other
processes are not blocked by a write. Decoda creates the schema and records its version in
``schema_version``; a file written by a newer schema is refused rather than misread. Rows past
their time to live read as absent and are deleted on the next write.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL,
    response TEXT NOT NULL,
    input_items TEXT NOT NULL,
    conversation TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_expiry ON responses (expires_at);
"""


@dataclass
class StoredResponse:
    id: str
    owner: str
    response: dict[str, Any]  # the response object, as the API returned it
    input_items: list[dict[str, Any]]  # the request's own input items
    conversation: list[dict[str, Any]]  # every item before the output, earlier turns' included

    def continued(self) -> list[dict[str, Any]]:
        """The conversation a response continuing this one starts from: everything, the output included."""
        return self.conversation + list(self.response["output"])


class ResponseStore(Protocol):
    """What ``/v1/responses`` needs of a store; every read takes the caller's owner."""

    async def get(self, response_id: str, owner: str) -> StoredResponse | None: ...

    async def put(self, stored: StoredResponse) -> None: ...

    async def delete(self, response_id: str, owner: str) -> bool: ...


class SqliteResponseStore:
    """``ResponseStore`` in one SQLite file; opened on first use, from a worker thread."""

    def __init__(self, path: Path, ttl: float = 0.0) -> None:
        self.path, self.ttl = path, ttl
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None

    def _open(self) -> sqlite3.Connection:
        if self._connection is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            connection = sqlite3.connect(self.path, check_same_thread=False, timeout=30, isolation_level=None)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.executescript(f"BEGIN IMMEDIATE; {SCHEMA} COMMIT;")
            version = connection.execute("SELECT max(version) FROM schema_version").fetchone()[0]
            if version is None:
                connection.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
            elif version > SCHEMA_VERSION:
                connection.close()
                raise RuntimeError(f"{self.path}: the responses store has schema version {version}; this "
                                   f"Decoda reads version {SCHEMA_VERSION} (upgrade Decoda)")  # fmt: skip
            self._connection = connection
        return self._connection

    def _run(self, work: Any, *args: Any) -> Any:  # noqa: ANN401
        with self._lock:
            return work(self._open(), *args)

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        return await asyncio.to_thread(self._run, self._get, response_id, owner)

    async def put(self, stored: StoredResponse) -> None:
        await asyncio.to_thread(self._run, self._put, stored)

    async def delete(self, response_id: str, owner: str) -> bool:
        return await asyncio.to_thread(self._run, self._delete, response_id, owner)

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def _get(self, db: sqlite3.Connection, response_id: str, owner: str) -> StoredResponse | None:
        row = db.execute(
            "SELECT response, input_items, conversation FROM responses WHERE id = ? AND owner = ? "
            "AND (expires_at IS NULL OR expires_at > ?)",
            (response_id, owner, time.time()),
        ).fetchone()
        if row is None:
            return None
        response, input_items, conversation = (json.loads(column) for column in row)
        return StoredResponse(response_id, owner, response, input_items, conversation)

    def _put(self, db: sqlite3.Connection, stored: StoredResponse) -> None:
        now = time.time()
        db.execute("DELETE FROM responses WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,))
        db.execute(
            "INSERT OR REPLACE INTO responses (id, owner, created_at, expires_at, response, input_items, "
            "conversation) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (stored.id, stored.owner, now, now + self.ttl if self.ttl else None, json.dumps(stored.response),
             json.dumps(stored.input_items), json.dumps(stored.conversation)),
        )  # fmt: skip

    def _delete(self, db: sqlite3.Connection, response_id: str, owner: str) -> bool:
        return db.execute("DELETE FROM responses WHERE id = ? AND owner = ?", (response_id, owner)).rowcount > 0


def stored_size(stored: StoredResponse) -> int:
    """Bytes the row's JSON takes, for the per-response cap."""
    return sum(len(json.dumps(part)) for part in (stored.response, stored.input_items, stored.conversation))


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
