"""Where stored responses live: one small interface (``ResponseStore``), SQLite behind it.

A stored response is its response object, its own input items (what ``input_items`` lists) and its
conversation: every item before its output, earlier turns included, so continuing it with
``previous_response_id`` is one read, and deleting an earlier turn never breaks a later one. Each
row names its owner, the SHA-256 digest of the bearer token that created it ("" without API keys):
a row read with another owner is as absent as a row that never was.

SQLite through Python's own ``sqlite3``: one connection, used under a lock from worker threads
(``asyncio.to_thread``), so the event loop never waits on the disk; WAL mode so readers of other
processes are not blocked by a write. Decoda creates the schema and records its version in
``schema_version``; a file written by a newer schema is refused rather than misread, one written by
an older one is migrated in place (version 1 had no ``status`` and ``updated_at``: they are filled
from the JSON and ``created_at``). Rows past their time to live read as absent and are deleted on the
next write.

``status`` (the response's) and ``updated_at`` (the last write, or the last heartbeat of the replica
running a background response: ``touch``) are columns so that ``fail_stale`` finds the queued and
in-progress rows whose replica stopped without reading any JSON.
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

SCHEMA_VERSION = 2
TABLES = (
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    expires_at REAL,
    status TEXT NOT NULL,
    response TEXT NOT NULL,
    input_items TEXT NOT NULL,
    conversation TEXT NOT NULL
)""",
)
MIGRATIONS = {  # version -> the statements that bring a file of that version to the next
    1: ("ALTER TABLE responses ADD COLUMN status TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE responses ADD COLUMN updated_at REAL NOT NULL DEFAULT 0",
        "UPDATE responses SET status = json_extract(response, '$.status'), updated_at = created_at"),
}  # fmt: skip
INDEXES = (
    "CREATE INDEX IF NOT EXISTS responses_expiry ON responses (expires_at)",
    "CREATE INDEX IF NOT EXISTS responses_unfinished ON responses (status, updated_at)",
)
UNFINISHED = ("queued", "in_progress")


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

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """The row, or None when it is absent, expired or another owner's."""
        ...

    async def put(self, stored: StoredResponse) -> None:
        """Insert or replace (an upsert: a background response is written at each status); the row's
        ``status`` is ``stored.response["status"]`` and its ``updated_at`` the time of the write."""
        ...

    async def delete(self, response_id: str, owner: str) -> bool:
        """Whether a row of that owner was there to delete."""
        ...

    async def touch(self, response_id: str) -> None:
        """``updated_at`` = now: the replica running this background response is alive (its heartbeat)."""
        ...

    async def fail_stale(self, before: float, error: dict[str, Any]) -> int:
        """Every row with status queued or in_progress and ``updated_at`` < ``before`` (its replica
        stopped heart-beating) becomes status ``failed`` with ``response.error`` = ``error``, in its
        column and in its JSON; returns how many."""
        ...


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
            try:
                connection.execute("BEGIN IMMEDIATE")  # one process at a time creates or migrates
                self._create_or_migrate(connection)
                connection.execute("COMMIT")
            except BaseException:
                connection.close()  # closing rolls back what the transaction did
                raise
            self._connection = connection
        return self._connection

    def _create_or_migrate(self, db: sqlite3.Connection) -> None:
        for statement in TABLES:
            db.execute(statement)
        version = db.execute("SELECT max(version) FROM schema_version").fetchone()[0]
        if version is None:
            db.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        elif version > SCHEMA_VERSION:
            raise RuntimeError(f"{self.path}: the responses store has schema version {version}; this "
                               f"Decoda reads version {SCHEMA_VERSION} (upgrade Decoda)")  # fmt: skip
        else:
            for older in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[older]:
                    db.execute(statement)
            db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
        for statement in INDEXES:
            db.execute(statement)

    def _run(self, work: Any, *args: Any) -> Any:  # noqa: ANN401
        with self._lock:
            return work(self._open(), *args)

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        return await asyncio.to_thread(self._run, self._get, response_id, owner)

    async def put(self, stored: StoredResponse) -> None:
        await asyncio.to_thread(self._run, self._put, stored)

    async def delete(self, response_id: str, owner: str) -> bool:
        return await asyncio.to_thread(self._run, self._delete, response_id, owner)

    async def touch(self, response_id: str) -> None:
        await asyncio.to_thread(self._run, self._touch, response_id)

    async def fail_stale(self, before: float, error: dict[str, Any]) -> int:
        return await asyncio.to_thread(self._run, self._fail_stale, before, error)

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
            "INSERT INTO responses (id, owner, created_at, updated_at, expires_at, status, response, input_items, "
            "conversation) VALUES (?1, ?2, ?3, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT (id) DO UPDATE SET "
            "owner = excluded.owner, updated_at = excluded.updated_at, expires_at = excluded.expires_at, "
            "status = excluded.status, response = excluded.response, input_items = excluded.input_items, "
            "conversation = excluded.conversation",
            (stored.id, stored.owner, now, now + self.ttl if self.ttl else None, stored.response["status"],
             json.dumps(stored.response), json.dumps(stored.input_items), json.dumps(stored.conversation)),
        )  # fmt: skip  # an upsert keeps the row's first created_at

    def _delete(self, db: sqlite3.Connection, response_id: str, owner: str) -> bool:
        return db.execute("DELETE FROM responses WHERE id = ? AND owner = ?", (response_id, owner)).rowcount > 0

    def _touch(self, db: sqlite3.Connection, response_id: str) -> None:
        db.execute("UPDATE responses SET updated_at = ? WHERE id = ?", (time.time(), response_id))

    def _fail_stale(self, db: sqlite3.Connection, before: float, error: dict[str, Any]) -> int:
        return db.execute(
            "UPDATE responses SET status = 'failed', updated_at = ?, response = json_set(response, '$.status', "
            "'failed', '$.error', json(?)) WHERE status IN (?, ?) AND updated_at < ?",
            (time.time(), json.dumps(error), *UNFINISHED, before),
        ).rowcount  # fmt: skip


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
