"""The responses store on PostgreSQL, so that replicas behind a load balancer share conversations.

The same ``ResponseStore`` contract and tables as the SQLite store (``postgres_schema``), through
asyncpg and its connection pool: the JSON columns are ``jsonb`` (PostgreSQL keeps a ``jsonb``
object's keys in its own order: a retrieved response holds the same fields, not always in the order
it was sent). Times are Unix seconds from this process's clock, as the SQLite store writes them.

Replicas write the same rows, so every write is one transaction whose conditions PostgreSQL checks
on the row as it is when the write gets its lock (``update`` after a cancel or a delete that
committed first changes nothing). Sweeps that touch many rows (expired conversations, stale leases)
run on one replica at a time (a try-lock: the others skip), so they never deadlock each other.

The pool opens on first use, on the event loop that uses it (an asyncpg pool belongs to one loop). A
database that cannot be reached, or that is restarting, is a 503 with ``Retry-After`` naming the
store, not a 500: the replica is fine, its store is not (nginx tries the next replica, which says the
same); the pool's connections are then replaced, so the store serves again as soon as the database
does, without restarting Decoda.

PostgreSQL text cannot hold the character U+0000 nor a lone UTF-16 surrogate (neither ``text`` nor
``jsonb``): a stored string keeps every other character, and those read back as U+FFFD.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from server.api.responses.postgres_schema import create_schema
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
from server.config.store_url import redacted_url
from server.http.errors import APIError

PURGE_LOCK = 0x6465636F646170  # pg_try_advisory_xact_lock's key for deleting expired conversations ("decodap")
SWEEP_LOCK = 0x6465636F646173  # and for failing the responses whose lease lapsed ("decodas")
POOL_SIZE = 10  # connections per replica: each holds one only for a statement or two
CONNECT_TIMEOUT = 10.0  # seconds: an unreachable database is a 503 soon, not a request hung for a minute
# what says the database, not the query, failed: no connection, a connection lost, the server
# starting, shutting down or out of connections, an operator's intervention, a connection the server
# dropped mid-protocol (asyncpg's client state then refuses the next step)
UNREACHABLE = (OSError, asyncio.TimeoutError, asyncpg.PostgresConnectionError, asyncpg.OperatorInterventionError,
               asyncpg.TooManyConnectionsError, asyncpg.InterfaceError, asyncpg.InternalClientError)  # fmt: skip
VISIBLE = "NOT deleted AND (expires_at IS NULL OR expires_at > $3 OR status IN ('queued', 'in_progress'))"
KEEP = ("INSERT INTO responses_conversations AS c (root_id, keep_until) VALUES ($1, $2) ON CONFLICT (root_id) DO "
        "UPDATE SET keep_until = CASE WHEN c.keep_until IS NULL OR excluded.keep_until IS NULL THEN NULL ELSE "
        "greatest(c.keep_until, excluded.keep_until) END")  # fmt: skip
CHAIN = """WITH RECURSIVE chain (id, n) AS (
    SELECT $1::text, 0
    UNION ALL
    SELECT r.previous_id, chain.n + 1 FROM chain JOIN responses r ON r.id = chain.id
    WHERE r.previous_id IS NOT NULL AND chain.n < $2
) SELECT r.input_items, r.output, r.conversation, r.bytes FROM chain JOIN responses r ON r.id = chain.id
ORDER BY chain.n DESC"""
PURGE = f"""WITH dead AS (
    DELETE FROM responses_conversations WHERE root_id IN (
        SELECT root_id FROM responses_conversations WHERE keep_until <= $1 LIMIT {EXPIRED_BATCH}) RETURNING root_id
), gone AS (DELETE FROM responses WHERE root_id IN (SELECT root_id FROM dead) RETURNING id)
DELETE FROM responses_leases WHERE id IN (SELECT id FROM gone)"""
# every escape of JSON text that jsonb refuses, and the escapes it must not cut in two: an escaped
# backslash, a surrogate pair; what is left is U+0000 or a lone surrogate, which become U+FFFD
_ESCAPES = re.compile(r"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\u[dD][89a-fA-F][0-9a-fA-F]{2}"
                      r"|\\u0000")  # fmt: skip


def _jsonb_safe(match: re.Match[str]) -> str:
    text = match.group(0)
    return text if text == "\\\\" or len(text) == 12 else "\\ufffd"


def encode_json(value: Any) -> str:  # noqa: ANN401
    """JSON text ``jsonb`` accepts: a U+0000 or a lone surrogate becomes U+FFFD."""
    return _ESCAPES.sub(_jsonb_safe, json.dumps(value))


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
        except BaseException as exc:
            await pool.close()
            if isinstance(exc, UNREACHABLE):
                raise self._unreachable(exc) from exc
            raise
        return pool

    def _unreachable(self, exc: BaseException) -> APIError:
        return store_unavailable(f"PostgreSQL at {redacted_url(self.url)}", exc)

    @asynccontextmanager
    async def _connection(self, transaction: bool = False) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection (in a transaction when asked); a database gone away is the 503, and the
        pool's connections are replaced so the next call connects afresh."""
        pool = await self._ready()
        try:
            async with pool.acquire() as connection:
                if transaction:
                    async with connection.transaction():
                        yield connection
                else:
                    yield connection
        except UNREACHABLE as exc:
            await pool.expire_connections()
            raise self._unreachable(exc) from exc

    # ---- reads --------------------------------------------------------------------------------------
    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        async with self._connection() as db:
            row = await db.fetchrow(f"SELECT previous_id, turns, response, input_items, output FROM responses "
                                    f"WHERE id = $1 AND owner = $2 AND {VISIBLE}",
                                    response_id, owner, time.time())  # fmt: skip
        if row is None:
            return None
        response = {**row["response"], "output": row["output"]}
        return StoredResponse(response_id, owner, response, row["input_items"], row["previous_id"], turns=row["turns"])

    async def status(self, response_id: str, owner: str) -> str | None:
        async with self._connection() as db:
            return await db.fetchval(f"SELECT status FROM responses WHERE id = $1 AND owner = $2 AND {VISIBLE}",
                                     response_id, owner, time.time())  # fmt: skip

    async def conversation(self, response_id: str, owner: str) -> Conversation | None:
        async with self._connection(transaction=True) as db:  # one snapshot: the row and its chain
            if await db.fetchval(f"SELECT 1 FROM responses WHERE id = $1 AND owner = $2 AND {VISIBLE}",
                                 response_id, owner, time.time()) is None:  # fmt: skip
                return None
            rows = await db.fetch(CHAIN, response_id, MAX_TURNS)
        items = chained([(row["input_items"], row["output"], row["conversation"]) for row in rows])
        return Conversation(items, sum(row["bytes"] for row in rows), len(rows))

    async def usage(self, owner: str) -> tuple[int, int]:
        async with self._connection() as db:
            row = await db.fetchrow("SELECT bytes, items FROM responses_usage WHERE owner = $1", owner)
        return (row["bytes"], row["items"]) if row else (0, 0)

    # ---- writes -------------------------------------------------------------------------------------
    def _expiry(self, now: float) -> float | None:
        return now + self.ttl if self.ttl else None

    async def create(self, stored: StoredResponse) -> None:
        now = time.time()
        async with self._connection(transaction=True) as db:
            if await db.fetchval("SELECT pg_try_advisory_xact_lock($1)", PURGE_LOCK):
                await db.execute(PURGE, now)
            previous_id, root_id, turns, inline = stored.previous_id, stored.id, 1, None
            if previous_id is not None:  # held until this commits: a delete of it waits and sees this turn
                found = await db.fetchrow("SELECT root_id, turns FROM responses WHERE id = $1 FOR KEY SHARE",
                                          previous_id)  # fmt: skip
                if found is None:  # deleted since it was read: this row keeps the conversation itself
                    previous_id, inline = None, (stored.earlier or []) + stored.input_items
                else:
                    root_id, turns = found["root_id"], found["turns"] + 1
            size, items = stored.size()
            if inline is not None:
                size, items = size + len(encode_json(inline)), items + len(inline)
            status = stored.response["status"]
            await db.execute(
                "INSERT INTO responses (id, owner, created_at, updated_at, expires_at, status, previous_id, root_id, "
                "turns, bytes, items, response, input_items, output, conversation) "
                "VALUES ($1, $2, $3, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
                stored.id, stored.owner, now, self._expiry(now), status, previous_id, root_id, turns, size, items,
                without_output(stored.response), stored.input_items, stored.response.get("output") or [], inline,
            )  # fmt: skip
            if status in UNFINISHED:
                await db.execute("INSERT INTO responses_leases (id, renewed_at) VALUES ($1, $2)", stored.id, now)
            await db.execute(KEEP, root_id, self._expiry(now))

    async def update(self, stored: StoredResponse, runner: bool = False) -> bool:
        now = time.time()
        status = stored.response["status"]
        size, items = stored.size()
        async with self._connection(transaction=True) as db:
            root_id = await db.fetchval(
                "UPDATE responses SET status = $1, response = $2, output = $3, bytes = $4 + "
                "coalesce(octet_length(conversation::text), 0), items = $5 + "
                "coalesce(jsonb_array_length(conversation), 0), updated_at = $6, expires_at = $7 WHERE id = $8 AND "
                "owner = $9 AND NOT deleted AND (status = ANY($10::text[]) OR ($11 AND status = 'cancelled' AND EXISTS "
                "(SELECT 1 FROM responses_leases l WHERE l.id = responses.id))) RETURNING root_id",
                status, without_output(stored.response), stored.response.get("output") or [], size, items, now,
                self._expiry(now), stored.id, stored.owner, list(UNFINISHED), runner and status == "cancelled",
            )  # fmt: skip
            if root_id is None:
                return False
            if runner and status not in UNFINISHED:
                await db.execute("DELETE FROM responses_leases WHERE id = $1", stored.id)
            await db.execute(KEEP, root_id, self._expiry(now))
        return True

    async def delete(self, response_id: str, owner: str) -> bool:
        async with self._connection(transaction=True) as db:
            found = await db.fetchrow(f"SELECT previous_id, root_id FROM responses WHERE id = $1 AND owner = $2 AND "
                                      f"{VISIBLE} FOR UPDATE", response_id, owner, time.time())  # fmt: skip
            if found is None:
                return False
            previous_id, root_id = found["previous_id"], found["root_id"]
            await db.execute("DELETE FROM responses_leases WHERE id = $1", response_id)
            if await db.fetchval("SELECT 1 FROM responses WHERE previous_id = $1 LIMIT 1", response_id):
                await db.execute("UPDATE responses SET deleted = true WHERE id = $1", response_id)
                return True
            await db.execute("DELETE FROM responses WHERE id = $1", response_id)
            for _ in range(MAX_TURNS):  # the hidden turns only this one still needed go with it
                if previous_id is None:
                    break
                above = await db.fetchrow("SELECT previous_id, deleted FROM responses WHERE id = $1 FOR UPDATE",
                                          previous_id)  # fmt: skip
                needed = await db.fetchval("SELECT 1 FROM responses WHERE previous_id = $1 LIMIT 1", previous_id)
                if above is None or not above["deleted"] or needed:
                    break
                await db.execute("DELETE FROM responses WHERE id = $1", previous_id)
                previous_id = above["previous_id"]
            if not await db.fetchval("SELECT 1 FROM responses WHERE root_id = $1 LIMIT 1", root_id):
                await db.execute("DELETE FROM responses_conversations WHERE root_id = $1", root_id)
        return True

    async def heartbeat(self, response_id: str) -> str | None:
        now = time.time()
        async with self._connection(transaction=True) as db:
            await db.execute("UPDATE responses_leases SET renewed_at = $2 WHERE id = $1", response_id, now)
            found = await db.fetchrow("SELECT status, deleted, root_id FROM responses WHERE id = $1", response_id)
            if found is None or found["deleted"]:
                return None
            if found["status"] in UNFINISHED:
                await db.execute(KEEP, found["root_id"], self._expiry(now))
            return found["status"]

    async def fail_stale(self, before: float, error: dict[str, Any]) -> int:
        """Fail the unfinished rows whose lease lapsed; 0 while another replica sweeps (it fails them)."""
        now = time.time()
        async with self._connection(transaction=True) as db:
            if not await db.fetchval("SELECT pg_try_advisory_xact_lock($1)", SWEEP_LOCK):
                return 0
            stale = [row["id"] for row in await db.fetch("DELETE FROM responses_leases WHERE renewed_at < $1 "
                                                         "RETURNING id", before)]  # fmt: skip
            if not stale:
                return 0
            roots = await db.fetch(
                "UPDATE responses SET status = 'failed', updated_at = $3, expires_at = $4, response = "
                "jsonb_set(jsonb_set(response, '{status}', '\"failed\"'), '{error}', $2::jsonb) WHERE id = "
                "ANY($1::text[]) AND status = ANY($5::text[]) AND NOT deleted RETURNING root_id",
                stale, error, now, self._expiry(now), list(UNFINISHED),
            )  # fmt: skip
            for root_id in {row["root_id"] for row in roots}:
                await db.execute(KEEP, root_id, self._expiry(now))
        return len(roots)

    async def close(self) -> None:
        """Close the pool (gracefully on the loop that opened it); a later call opens a new one."""
        pool, self._pool = self._pool, None
        if pool is not None and self._loop is asyncio.get_running_loop():
            await pool.close()
        elif pool is not None:
            abandon(pool)


def abandon(pool: asyncpg.Pool) -> None:
    """Drop the connections of a pool whose loop is gone (tests that run one loop per call), as far as
    a closed loop still allows; the rest close when the pool is collected."""
    try:
        pool.terminate()
    except RuntimeError:  # its loop is closed
        pass
