"""``ResponseStore`` in one SQLite file (``--responses-store sqlite:///PATH``, the default).

Through Python's own ``sqlite3``: one connection, used under a lock from worker threads
(``asyncio.to_thread``), so the event loop never waits on the disk; WAL mode so readers of other
processes are not blocked by a write. Every write is one ``BEGIN IMMEDIATE`` transaction. An error
of the file (full disk, read-only file or mount, I/O error, locked past the timeout) closes the
connection and is a 503 naming the file; the next call opens it again, so a disk that was fixed
serves again without restarting Decoda. The schema and its versions: ``sqlite_schema``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from server.api.responses.sqlite_schema import create_or_migrate
from server.api.responses.store import (
    EXPIRED_BATCH,
    MAX_TURNS,
    UNFINISHED,
    Conversation,
    StoredResponse,
    chained,
    store_unavailable,
    without_output,
)

VISIBLE = "NOT deleted AND (expires_at IS NULL OR expires_at > ? OR status IN ('queued', 'in_progress'))"
KEEP = ("INSERT INTO responses_conversations (root_id, keep_until) VALUES (?1, ?2) ON CONFLICT (root_id) DO UPDATE SET "
        "keep_until = CASE WHEN keep_until IS NULL OR ?2 IS NULL THEN NULL ELSE max(keep_until, ?2) END")  # fmt: skip
# a row a write may change: unfinished, or (the runner's own cancelled object) cancelled while it still runs
WRITABLE = ("status IN ('queued', 'in_progress') OR (? AND status = 'cancelled' AND EXISTS (SELECT 1 FROM "
            "responses_leases l WHERE l.id = responses.id))")  # fmt: skip
CHAIN = """WITH RECURSIVE chain (id, n) AS (
    SELECT ?, 0
    UNION ALL
    SELECT r.previous_id, chain.n + 1 FROM chain JOIN responses r ON r.id = chain.id
    WHERE r.previous_id IS NOT NULL AND chain.n < ?
) SELECT r.input_items, r.output, r.conversation, r.bytes FROM chain JOIN responses r ON r.id = chain.id
ORDER BY chain.n DESC"""
# what the file, not the statement, failed at (a constraint or a misuse is a bug, not the disk)
FILE_ERRORS = (sqlite3.OperationalError, sqlite3.DatabaseError)
BUGS = (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError, sqlite3.DataError)


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """One write: all of it or nothing (SQLite may have rolled back already on a full disk)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if db.in_transaction:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the connection is closed next: closing rolls back what is left
        raise
    db.execute("COMMIT")


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
            try:
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute("PRAGMA synchronous=NORMAL")
                with transaction(connection):  # one process at a time creates or migrates
                    create_or_migrate(connection, self.path)
            except BaseException:
                connection.close()
                raise
            self._connection = connection
        return self._connection

    def _run(self, work: Any, *args: Any) -> Any:  # noqa: ANN401
        with self._lock:
            try:
                return work(self._open(), *args)
            except BUGS:
                raise
            except FILE_ERRORS as exc:
                self._drop()
                raise store_unavailable(f"SQLite at {self.path}", exc) from exc
            except OSError as exc:  # the folder cannot be made
                raise store_unavailable(f"SQLite at {self.path}", exc) from exc

    def _drop(self) -> None:
        if self._connection is not None:
            try:
                self._connection.close()
            except sqlite3.Error:
                pass
            self._connection = None

    def close(self) -> None:
        with self._lock:
            self._drop()

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        return await asyncio.to_thread(self._run, self._get, response_id, owner)

    async def status(self, response_id: str, owner: str) -> str | None:
        return await asyncio.to_thread(self._run, self._status, response_id, owner)

    async def conversation(self, response_id: str, owner: str) -> Conversation | None:
        return await asyncio.to_thread(self._run, self._conversation, response_id, owner)

    async def usage(self, owner: str) -> tuple[int, int]:
        return await asyncio.to_thread(self._run, self._usage, owner)

    async def create(self, stored: StoredResponse) -> None:
        await asyncio.to_thread(self._run, self._create, stored)

    async def update(self, stored: StoredResponse, runner: bool = False) -> bool:
        return await asyncio.to_thread(self._run, self._update, stored, runner)

    async def delete(self, response_id: str, owner: str) -> bool:
        return await asyncio.to_thread(self._run, self._delete, response_id, owner)

    async def heartbeat(self, response_id: str) -> str | None:
        return await asyncio.to_thread(self._run, self._heartbeat, response_id)

    async def fail_stale(self, before: float, error: dict[str, Any]) -> int:
        return await asyncio.to_thread(self._run, self._fail_stale, before, error)

    # ---- reads --------------------------------------------------------------------------------------
    def _get(self, db: sqlite3.Connection, response_id: str, owner: str) -> StoredResponse | None:
        row = db.execute(f"SELECT previous_id, turns, response, input_items, output FROM responses WHERE id = ? "
                         f"AND owner = ? AND {VISIBLE}", (response_id, owner, time.time())).fetchone()  # fmt: skip
        if row is None:
            return None
        previous_id, turns, response, input_items, output = row
        response = {**json.loads(response), "output": json.loads(output)}
        return StoredResponse(response_id, owner, response, json.loads(input_items), previous_id, turns=turns)

    def _status(self, db: sqlite3.Connection, response_id: str, owner: str) -> str | None:
        row = db.execute(f"SELECT status FROM responses WHERE id = ? AND owner = ? AND {VISIBLE}",
                         (response_id, owner, time.time())).fetchone()  # fmt: skip
        return row[0] if row else None

    def _conversation(self, db: sqlite3.Connection, response_id: str, owner: str) -> Conversation | None:
        if self._status(db, response_id, owner) is None:
            return None
        rows = db.execute(CHAIN, (response_id, MAX_TURNS)).fetchall()
        decoded = [(json.loads(i), json.loads(o), json.loads(c) if c is not None else None) for i, o, c, _ in rows]
        return Conversation(chained(decoded), sum(row[3] for row in rows), len(rows))

    def _usage(self, db: sqlite3.Connection, owner: str) -> tuple[int, int]:
        row = db.execute("SELECT bytes, items FROM responses_usage WHERE owner = ?", (owner,)).fetchone()
        return (row[0], row[1]) if row else (0, 0)

    # ---- writes -------------------------------------------------------------------------------------
    def _expiry(self, now: float) -> float | None:
        return now + self.ttl if self.ttl else None

    def _create(self, db: sqlite3.Connection, stored: StoredResponse) -> None:
        now = time.time()
        with transaction(db):
            self._purge(db, now)
            previous_id, root_id, turns, inline = stored.previous_id, stored.id, 1, None
            if previous_id is not None:
                found = db.execute("SELECT root_id, turns FROM responses WHERE id = ?", (previous_id,)).fetchone()
                if found is None:  # deleted since it was read: this row keeps the conversation itself
                    previous_id, inline = None, (stored.earlier or []) + stored.input_items
                else:
                    root_id, turns = found[0], found[1] + 1
            size, items = stored.size()
            if inline is not None:
                size, items = size + len(json.dumps(inline)), items + len(inline)
            status = stored.response["status"]
            db.execute(
                "INSERT INTO responses (id, owner, created_at, updated_at, expires_at, status, previous_id, root_id, "
                "turns, bytes, items, response, input_items, output, conversation) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (stored.id, stored.owner, now, now, self._expiry(now), status, previous_id, root_id, turns, size,
                 items, json.dumps(without_output(stored.response)), json.dumps(stored.input_items),
                 json.dumps(stored.response.get("output") or []), json.dumps(inline) if inline is not None else None),
            )  # fmt: skip
            if status in UNFINISHED:
                db.execute("INSERT INTO responses_leases (id, renewed_at) VALUES (?, ?)", (stored.id, now))
            db.execute(KEEP, (root_id, self._expiry(now)))

    def _update(self, db: sqlite3.Connection, stored: StoredResponse, runner: bool) -> bool:
        now = time.time()
        status = stored.response["status"]
        size, items = stored.size()
        with transaction(db):
            written = db.execute(
                "UPDATE responses SET status = ?, response = ?, output = ?, bytes = ? + coalesce(length(conversation), "
                "0), items = ? + coalesce(json_array_length(conversation), 0), updated_at = ?, expires_at = ? "
                f"WHERE id = ? AND owner = ? AND NOT deleted AND ({WRITABLE})",
                (status, json.dumps(without_output(stored.response)), json.dumps(stored.response.get("output") or []),
                 size, items, now, self._expiry(now), stored.id, stored.owner, runner and status == "cancelled"),
            ).rowcount  # fmt: skip
            if not written:
                return False
            if runner and status not in UNFINISHED:
                db.execute("DELETE FROM responses_leases WHERE id = ?", (stored.id,))
            (root_id,) = db.execute("SELECT root_id FROM responses WHERE id = ?", (stored.id,)).fetchone()
            db.execute(KEEP, (root_id, self._expiry(now)))
        return True

    def _delete(self, db: sqlite3.Connection, response_id: str, owner: str) -> bool:
        with transaction(db):
            found = db.execute(f"SELECT previous_id, root_id FROM responses WHERE id = ? AND owner = ? AND {VISIBLE}",
                               (response_id, owner, time.time())).fetchone()  # fmt: skip
            if found is None:
                return False
            previous_id, root_id = found
            db.execute("DELETE FROM responses_leases WHERE id = ?", (response_id,))
            if db.execute("SELECT 1 FROM responses WHERE previous_id = ? LIMIT 1", (response_id,)).fetchone():
                db.execute("UPDATE responses SET deleted = 1 WHERE id = ?", (response_id,))  # later turns read it
                return True
            db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
            for _ in range(MAX_TURNS):  # the hidden turns only this one still needed go with it
                if previous_id is None:
                    break
                above = db.execute("SELECT previous_id, deleted FROM responses WHERE id = ?", (previous_id,)).fetchone()
                needed = db.execute("SELECT 1 FROM responses WHERE previous_id = ? LIMIT 1", (previous_id,)).fetchone()
                if above is None or not above[1] or needed:
                    break
                db.execute("DELETE FROM responses WHERE id = ?", (previous_id,))
                previous_id = above[0]
            if not db.execute("SELECT 1 FROM responses WHERE root_id = ? LIMIT 1", (root_id,)).fetchone():
                db.execute("DELETE FROM responses_conversations WHERE root_id = ?", (root_id,))
        return True

    def _heartbeat(self, db: sqlite3.Connection, response_id: str) -> str | None:
        now = time.time()
        with transaction(db):
            db.execute("UPDATE responses_leases SET renewed_at = ? WHERE id = ?", (now, response_id))
            found = db.execute("SELECT status, deleted, root_id FROM responses WHERE id = ?", (response_id,)).fetchone()
            if found is None or found[1]:
                return None
            if found[0] in UNFINISHED:
                db.execute(KEEP, (found[2], self._expiry(now)))
            return found[0]

    def _fail_stale(self, db: sqlite3.Connection, before: float, error: dict[str, Any]) -> int:
        now = time.time()
        stale = "SELECT id FROM responses_leases WHERE renewed_at < ?"
        with transaction(db):
            failed = db.execute(
                "UPDATE responses SET status = 'failed', updated_at = ?, expires_at = ?, response = json_set(response, "
                f"'$.status', 'failed', '$.error', json(?)) WHERE id IN ({stale}) AND status IN ('queued', "
                "'in_progress') AND NOT deleted",
                (now, self._expiry(now), json.dumps(error), before),
            ).rowcount  # fmt: skip
            roots = db.execute(f"SELECT DISTINCT root_id FROM responses WHERE id IN ({stale})", (before,)).fetchall()
            for (root_id,) in roots:
                db.execute(KEEP, (root_id, self._expiry(now)))
            db.execute("DELETE FROM responses_leases WHERE renewed_at < ?", (before,))
        return failed

    def _purge(self, db: sqlite3.Connection, now: float) -> None:
        """Delete the conversations every row of which is past its time to live (a batch a write)."""
        roots = [row[0] for row in db.execute("SELECT root_id FROM responses_conversations WHERE keep_until <= ? "
                                              "LIMIT ?", (now, EXPIRED_BATCH))]  # fmt: skip
        if not roots:
            return
        marks = ", ".join("?" * len(roots))
        in_roots = f"SELECT id FROM responses WHERE root_id IN ({marks})"
        db.execute(f"DELETE FROM responses_leases WHERE id IN ({in_roots})", roots)
        db.execute(f"DELETE FROM responses WHERE root_id IN ({marks})", roots)
        db.execute(f"DELETE FROM responses_conversations WHERE root_id IN ({marks})", roots)
