"""The responses store on PostgreSQL, so that replicas behind a load balancer share conversations.

The same ``ResponseStore`` contract and table as ``server.api.responses.store`` (SQLite), through
asyncpg and its connection pool: the JSON columns are ``jsonb`` (PostgreSQL keeps a ``jsonb``
object's keys in its own order: a retrieved response holds the same fields, not always in the order
it was sent). Times are Unix seconds from this process's clock, as the SQLite store writes them, so
``fail_stale(before)`` compares like with like.

The pool opens on first use, on the event loop that uses it (an asyncpg pool belongs to one loop).
Opening creates the schema in one transaction under an advisory lock, so replicas that start
together do not race on ``CREATE TABLE``; a database written by a newer schema is refused rather
than misread. A database that cannot be reached is a 503 with ``Retry-After`` naming the store,
not a 500: the replica is fine, its store is not (nginx tries the next replica, which says the same).

PostgreSQL text cannot hold the character U+0000 (neither ``text`` nor ``jsonb``): a stored string
keeps every other character, and a U+0000 in it reads back as U+FFFD.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import asyncpg

from server.api.responses.store import UNFINISHED, StoredResponse
from server.config.store_url import redacted_url
from server.http.errors import APIError, unavailable

SCHEMA_VERSION = 2  # the layout of store.py's SCHEMA_VERSION 2, which this table mirrors column for column
SCHEMA_LOCK = 0x6465636F646172  # pg_advisory_xact_lock's key for creating the schema ("decodar")
SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION,
    status TEXT NOT NULL,
    response JSONB NOT NULL,
    input_items JSONB NOT NULL,
    conversation JSONB NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_expiry ON responses (expires_at);
CREATE INDEX IF NOT EXISTS responses_unfinished ON responses (updated_at) WHERE status IN ('queued', 'in_progress');
"""
EXPIRED_BATCH = 1000  # expired rows one write deletes at most: the reads skip the rest until later writes
POOL_SIZE = 10  # connections per replica: each holds one only for a statement or two
CONNECT_TIMEOUT = 10.0  # seconds: an unreachable database is a 503 soon, not a request hung for a minute
# what says the database, not the query, failed: no connection, a connection lost, the server
# starting, shutting down or out of connections
UNREACHABLE = (OSError, asyncio.TimeoutError, asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError,
               asyncpg.TooManyConnectionsError)  # fmt: skip
# a \u0000 escape in JSON text (an even number of backslashes before it: not an escaped backslash)
_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def encode_json(value: Any) -> str:  # noqa: ANN401
    """JSON text ``jsonb`` accepts: a U+0000 becomes U+FFFD (PostgreSQL text cannot hold it)."""
    return _NUL_ESCAPE.sub(r"\1\\ufffd", json.dumps(value))


async def _json_codecs(connection: asyncpg.Connection) -> None:
    await connection.set_type_codec("jsonb", encoder=encode_json, decoder=json.loads, schema="pg_catalog")


class PostgresResponseStore:
    """``ResponseStore`` in a PostgreSQL database that every replica names with the same URL."""

    def __init__(self, url: str, ttl: float = 0.0, pool_size: int = POOL_SIZE) -> None:
        self.url, self.ttl, self.pool_size = url, ttl, pool_size
        self._pool: asyncpg.Pool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opening: asyncio.Lock | None = None

    async def _ready(self) -> asyncpg.Pool:
        """The pool of the running loop, opened (and the schema made) by its first caller."""
        loop = asyncio.get_running_loop()
        if self._pool is not None and self._loop is loop:
            return self._pool
        if self._loop is not loop:  # a pool (and a lock) of another loop cannot serve this one
            if self._pool is not None:
                abandon(self._pool)
            self._loop, self._pool, self._opening = loop, None, asyncio.Lock()
        assert self._opening is not None
        async with self._opening:
            if self._pool is None:
                self._pool = await self._open()
        return self._pool

    async def _open(self) -> asyncpg.Pool:
        try:
            pool = await asyncpg.create_pool(self.url, min_size=1, max_size=self.pool_size, init=_json_codecs,
                                             timeout=CONNECT_TIMEOUT, command_timeout=60)  # fmt: skip
        except UNREACHABLE as exc:
            raise self._unreachable(exc) from exc
        try:
            async with pool.acquire() as connection, connection.transaction():
                await create_schema(connection)
        except BaseException:
            await pool.close()
            raise
        return pool

    def _unreachable(self, exc: BaseException) -> APIError:
        return unavailable(f"the responses store (PostgreSQL at {redacted_url(self.url)}) cannot be reached: "
                           f"{type(exc).__name__}: {exc}", code="responses_store_unavailable")  # fmt: skip

    async def _run(self, statement: str, method: str, *args: Any) -> Any:  # noqa: ANN401
        pool = await self._ready()
        try:
            return await getattr(pool, method)(statement, *args)
        except UNREACHABLE as exc:
            raise self._unreachable(exc) from exc

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        row = await self._run(
            "SELECT response, input_items, conversation FROM responses WHERE id = $1 AND owner = $2 "
            "AND (expires_at IS NULL OR expires_at > $3)",
            "fetchrow", response_id, owner, time.time(),
        )  # fmt: skip
        if row is None:
            return None
        return StoredResponse(response_id, owner, row["response"], row["input_items"], row["conversation"])

    async def put(self, stored: StoredResponse) -> None:
        """Insert or replace (the row's first ``created_at`` kept), after deleting expired rows: up to
        ``EXPIRED_BATCH`` a write, skipping those another replica is deleting (no waits, no deadlocks)."""
        now = time.time()
        await self._run("DELETE FROM responses WHERE id IN (SELECT id FROM responses WHERE expires_at <= $1 "
                        f"LIMIT {EXPIRED_BATCH} FOR UPDATE SKIP LOCKED)", "execute", now)  # fmt: skip
        await self._run(
            "INSERT INTO responses (id, owner, created_at, updated_at, expires_at, status, response, input_items, "
            "conversation) VALUES ($1, $2, $3, $3, $4, $5, $6, $7, $8) ON CONFLICT (id) DO UPDATE SET owner = "
            "excluded.owner, updated_at = excluded.updated_at, expires_at = excluded.expires_at, status = "
            "excluded.status, response = excluded.response, input_items = excluded.input_items, conversation = "
            "excluded.conversation",
            "execute", stored.id, stored.owner, now, now + self.ttl if self.ttl else None, stored.response["status"],
            stored.response, stored.input_items, stored.conversation,
        )  # fmt: skip

    async def delete(self, response_id: str, owner: str) -> bool:
        status = await self._run("DELETE FROM responses WHERE id = $1 AND owner = $2", "execute", response_id, owner)
        return affected(status) > 0

    async def touch(self, response_id: str) -> None:
        """The row is alive: its ``updated_at`` is now (a background response's worker says so)."""
        await self._run("UPDATE responses SET updated_at = $2 WHERE id = $1", "execute", response_id, time.time())

    async def fail_stale(self, before: float, error: dict[str, Any]) -> int:
        """Every queued or in-progress row nobody wrote since ``before`` (its replica died) becomes
        ``failed`` with ``error``, in its column and in its response; how many did."""
        status = await self._run(
            "UPDATE responses SET status = 'failed', updated_at = $3, response = jsonb_set(jsonb_set(response, "
            "'{status}', '\"failed\"'), '{error}', $2::jsonb) WHERE status = ANY($4::text[]) AND updated_at < $1",
            "execute", before, error, time.time(), list(UNFINISHED),
        )  # fmt: skip
        return affected(status)

    async def close(self) -> None:
        """Close the pool (gracefully on the loop that opened it); a later call opens a new one."""
        pool, self._pool = self._pool, None
        if pool is not None and self._loop is asyncio.get_running_loop():
            await pool.close()
        elif pool is not None:
            abandon(pool)


async def create_schema(connection: asyncpg.Connection) -> None:
    """Make the tables and record the version, in the caller's transaction, one replica at a time."""
    await connection.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
    await connection.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    version = await connection.fetchval("SELECT max(version) FROM schema_version")
    if version is not None and version > SCHEMA_VERSION:  # checked before any DDL touches a newer layout
        raise RuntimeError(f"the PostgreSQL responses store has schema version {version}; this Decoda reads "
                           f"version {SCHEMA_VERSION} (upgrade Decoda)")  # fmt: skip
    await connection.execute(SCHEMA)
    if version is None:
        await connection.execute("INSERT INTO schema_version (version) VALUES ($1)", SCHEMA_VERSION)


def abandon(pool: asyncpg.Pool) -> None:
    """Drop the connections of a pool whose loop is gone (tests that run one loop per call), as far as
    a closed loop still allows; the rest close when the pool is collected."""
    try:
        pool.terminate()
    except RuntimeError:  # its loop is closed
        pass


def affected(status: str) -> int:
    """The row count of a command tag (``DELETE 1``, ``UPDATE 3``)."""
    return int(status.rsplit(" ", 1)[-1])
