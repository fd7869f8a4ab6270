"""The responses store's contract (``ResponseStore``), run against every backend the ``store`` fixture
yields (SQLite here; a PostgreSQL backend adds itself to the fixture's params), then what only the
SQLite file has: its schema version, WAL, the migration of a version-1 file, and refusing a newer one."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path

import pytest

from server.api.responses.store import SCHEMA_VERSION, SqliteResponseStore, StoredResponse
from server.api.responses.store_postgres import PostgresResponseStore
from server.api.responses.stores import close_store
from tests.postgres import fresh_schema, needs_postgres
from tests.test_api import run

ERROR = {"code": "server_error", "message": "the replica running this response stopped before it finished"}


def row(response_id: str, status: str = "completed", owner: str = "o", **fields: object) -> StoredResponse:
    response = {"id": response_id, "object": "response", "status": status, "error": None, "output": [], **fields}
    return StoredResponse(response_id, owner, response, [{"id": "msg_1"}], [{"id": "msg_0"}, {"id": "msg_1"}])


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=needs_postgres)])
def store(request, tmp_path):
    """A fresh, empty store of each backend (PostgreSQL: a new schema in ``DECODA_TEST_POSTGRES_URL``'s
    database, dropped after; skipped, saying why, without that variable)."""
    if request.param == "postgresql":
        with fresh_schema() as url:
            made = PostgresResponseStore(url)
            yield made
            run(close_store(made))
        return
    made = SqliteResponseStore(tmp_path / "responses.db")
    yield made
    made.close()


def test_put_get_delete_and_owners(store):
    async def go() -> None:
        await store.put(row("resp_1", owner="alice", metadata={"k": "v"}))
        found = await store.get("resp_1", "alice")
        assert found.response == row("resp_1", owner="alice", metadata={"k": "v"}).response
        assert found.input_items == [{"id": "msg_1"}] and found.conversation == [{"id": "msg_0"}, {"id": "msg_1"}]
        assert await store.get("resp_1", "bob") is None and not await store.delete("resp_1", "bob")
        assert await store.get("resp_nope", "alice") is None
        assert await store.delete("resp_1", "alice") and await store.get("resp_1", "alice") is None

    run(go())


def test_put_is_an_upsert_of_the_status(store):
    async def go() -> None:
        await asyncio.gather(*(store.put(row(f"resp_{i}")) for i in range(12)))  # concurrent writes
        for status in ("queued", "in_progress", "completed"):
            await store.put(row("resp_1", status))
            assert (await store.get("resp_1", "o")).response["status"] == status
        assert await store.fail_stale(time.time() + 60, ERROR) == 0  # completed: its status column moved too

    run(go())


def test_fail_stale_fails_only_unfinished_rows_nobody_touched(store):
    async def go() -> None:
        for response_id, status in (("queued", "queued"), ("running", "in_progress"), ("done", "completed"),
                                    ("cancelled", "cancelled"), ("alive", "in_progress")):  # fmt: skip
            await store.put(row(response_id, status, owner=f"owner-{response_id}"))
        await asyncio.sleep(0.05)
        before = time.time()
        await asyncio.sleep(0.05)
        await store.touch("alive")  # its replica's heartbeat, after ``before``
        await store.touch("resp_absent")  # touching nothing is no error
        assert await store.fail_stale(before, ERROR) == 2
        for response_id in ("queued", "running"):
            failed = (await store.get(response_id, f"owner-{response_id}")).response
            assert failed["status"] == "failed" and failed["error"] == ERROR and failed["id"] == response_id
        for response_id, status in (("done", "completed"), ("cancelled", "cancelled"), ("alive", "in_progress")):
            kept = (await store.get(response_id, f"owner-{response_id}")).response
            assert kept["status"] == status and kept["error"] is None
        assert await store.fail_stale(before, ERROR) == 0  # failed rows are finished
        assert await store.fail_stale(time.time() + 1, ERROR) == 1  # the live one, once it stops touching

    run(go())


# ---- SQLite only ------------------------------------------------------------------------------------
def test_the_sqlite_file_keeps_its_schema_version_and_forgets_expired_rows(tmp_path):
    async def go() -> None:
        store = SqliteResponseStore(tmp_path / "r.db", ttl=0.5)
        await store.put(row("resp_1"))
        assert (await store.get("resp_1", "o")) is not None
        await asyncio.sleep(0.6)
        assert await store.get("resp_1", "o") is None  # past its time to live
        store.close()

    run(go())
    db = sqlite3.connect(tmp_path / "r.db")
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)] == [(2,)]
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    db.commit()
    with pytest.raises(RuntimeError, match="schema version"):
        run(SqliteResponseStore(tmp_path / "r.db").get("x", ""))


VERSION_1 = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version (version) VALUES (1);
CREATE TABLE responses (id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at REAL NOT NULL, expires_at REAL,
                        response TEXT NOT NULL, input_items TEXT NOT NULL, conversation TEXT NOT NULL);
CREATE INDEX responses_expiry ON responses (expires_at);
"""


def test_a_version_1_file_is_migrated_in_place(tmp_path: Path):
    path = tmp_path / "v1.db"
    db = sqlite3.connect(path)
    db.executescript(VERSION_1)
    for response_id, status, created in (("resp_old", "completed", 1000.0), ("resp_stuck", "in_progress", 2000.0)):
        db.execute("INSERT INTO responses VALUES (?, 'o', ?, NULL, ?, '[]', '[]')",
                   (response_id, created, json.dumps(row(response_id, status).response)))  # fmt: skip
    db.commit()
    db.close()

    async def go() -> None:
        store = SqliteResponseStore(path)
        assert (await store.get("resp_old", "o")).response == row("resp_old").response
        assert await store.fail_stale(1500.0, ERROR) == 0  # updated_at is created_at: 2000 is not before 1500
        assert await store.fail_stale(2500.0, ERROR) == 1
        assert (await store.get("resp_stuck", "o")).response["status"] == "failed"
        await store.put(row("resp_new", "queued"))
        store.close()

    run(go())
    db = sqlite3.connect(path)
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(2,)]
    statuses = dict(db.execute("SELECT id, status FROM responses").fetchall())
    assert statuses == {"resp_old": "completed", "resp_stuck": "failed", "resp_new": "queued"}
    assert db.execute("SELECT updated_at FROM responses WHERE id = 'resp_old'").fetchone() == (1000.0,)
    run(SqliteResponseStore(path).get("resp_old", "o"))  # a second open finds version 2: nothing to migrate
