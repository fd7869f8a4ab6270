"""The responses store's contract (``ResponseStore``), run against every backend the ``stores`` fixture
yields (SQLite here; PostgreSQL where ``DECODA_TEST_POSTGRES_URL`` is set), two store objects on one
file or database standing for two replicas; then what only the SQLite file has: its schema version,
WAL, the migration of version-1 and version-2 files, refusing a newer one, and a heartbeat that
never rewrites the response's row."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from server.api.responses.sqlite_schema import SCHEMA_VERSION
from server.api.responses.store import StoredResponse
from server.api.responses.store_postgres import PostgresResponseStore
from server.api.responses.store_sqlite import SqliteResponseStore
from server.api.responses.stores import close_store
from tests.postgres import fresh_schema, needs_postgres
from tests.test_api import run

ERROR = {"code": "server_error", "message": "the replica running this response stopped before it finished"}


def item(item_id: str, text: str = "hi", role: str = "user") -> dict:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"id": item_id, "type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def row(response_id: str, status: str = "completed", owner: str = "o", previous: str | None = None,
        text: str = "hi", **fields: object) -> StoredResponse:  # fmt: skip
    """A response whose input is one item ``in_<id>`` and, once finished, whose output is ``out_<id>``."""
    output = [item(f"out_{response_id}", text, "assistant")] if status not in ("queued", "in_progress") else []
    response = {"id": response_id, "object": "response", "status": status, "error": None, "output": output, **fields}
    return StoredResponse(response_id, owner, response, [item(f"in_{response_id}", text)], previous)


def ended(stored: StoredResponse, status: str) -> StoredResponse:
    """The same row with its response ``status`` (and an output, once finished)."""
    return row(stored.id, status, stored.owner, stored.previous_id)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=needs_postgres)])
def stores(request, tmp_path) -> Callable[..., object]:
    """Makes stores of one backend on one fresh, empty file or database (each one a replica of it);
    PostgreSQL: a new schema in ``DECODA_TEST_POSTGRES_URL``'s database, dropped after."""
    made: list = []
    if request.param == "postgresql":
        with fresh_schema() as url:

            def make(ttl: float = 0.0) -> PostgresResponseStore:
                made.append(PostgresResponseStore(url, ttl))
                return made[-1]

            yield make
            for store in made:
                run(close_store(store))
        return

    def make_sqlite(ttl: float = 0.0) -> SqliteResponseStore:
        made.append(SqliteResponseStore(tmp_path / "responses.db", ttl))
        return made[-1]

    yield make_sqlite
    for store in made:
        store.close()


def ids(items: list[dict]) -> list[str]:
    return [entry["id"] for entry in items]


def test_create_get_delete_and_owners(stores):
    async def go() -> None:
        store = stores()
        await store.create(row("resp_1", owner="alice", metadata={"k": "v"}))
        found = await store.get("resp_1", "alice")
        assert found.response == row("resp_1", owner="alice", metadata={"k": "v"}).response
        assert ids(found.input_items) == ["in_resp_1"] and found.previous_id is None and found.turns == 1
        assert await store.get("resp_1", "bob") is None and not await store.delete("resp_1", "bob")
        assert await store.status("resp_1", "alice") == "completed" and await store.status("resp_1", "bob") is None
        assert await store.get("resp_nope", "alice") is None
        assert await store.delete("resp_1", "alice") and await store.get("resp_1", "alice") is None
        assert not await store.delete("resp_1", "alice")

    run(go())


def test_a_turn_stores_what_it_adds_and_the_conversation_is_rebuilt_from_the_chain(stores):
    async def go() -> None:
        store = stores()
        await store.create(row("resp_a"))
        await store.create(row("resp_b", previous="resp_a"))
        await store.create(row("resp_c", previous="resp_b"))
        await store.create(row("resp_d", previous="resp_b"))  # a branch: b continued twice
        third = await store.get("resp_c", "o")
        assert ids(third.input_items) == ["in_resp_c"] and third.previous_id == "resp_b" and third.turns == 3
        conversation = await store.conversation("resp_c", "o")
        assert ids(conversation.items) == ["in_resp_a", "out_resp_a", "in_resp_b", "out_resp_b", "in_resp_c",
                                           "out_resp_c"] and conversation.turns == 3  # fmt: skip
        assert ids((await store.conversation("resp_d", "o")).items)[-2:] == ["in_resp_d", "out_resp_d"]
        assert await store.conversation("resp_c", "other") is None and await store.conversation("nope", "o") is None
        sizes = [row(name).size() for name in ("resp_a", "resp_b", "resp_c", "resp_d")]
        assert await store.usage("o") == (sum(s[0] for s in sizes), sum(s[1] for s in sizes)) == (
            conversation.bytes + sizes[3][0], 8)  # each turn once: 4 rows, 2 items each  # fmt: skip
        assert await store.usage("other") == (0, 0)

    run(go())


def test_deleting_an_earlier_turn_hides_it_and_keeps_the_later_turns_conversation(stores):
    async def go() -> None:
        store = stores()
        await store.create(row("resp_a"))
        await store.create(row("resp_b", previous="resp_a"))
        await store.create(row("resp_c", previous="resp_b"))
        assert await store.delete("resp_b", "o")
        assert await store.get("resp_b", "o") is None and await store.conversation("resp_b", "o") is None
        assert not await store.delete("resp_b", "o")  # deleted stays deleted
        assert len((await store.conversation("resp_c", "o")).items) == 6  # b's items still there for c
        assert (await store.usage("o"))[1] == 6  # and still stored
        assert await store.delete("resp_c", "o")  # its last reader gone, the hidden b goes with it
        assert await store.usage("o") == (row("resp_a").size()[0], 2)
        assert await store.delete("resp_a", "o") and await store.usage("o") == (0, 0)

    run(go())


def test_writes_apply_only_while_unfinished_and_never_revive_a_deleted_response(stores):
    async def go() -> None:
        store = stores()
        running = row("resp_run", "queued")
        await store.create(running)
        assert await store.update(ended(running, "in_progress"), runner=True)
        cancel = StoredResponse("resp_run", "o", {**ended(running, "cancelled").response, "output": []}, [])
        assert await store.update(cancel)  # a cancel made on another replica
        assert not await store.update(ended(running, "completed"), runner=True)  # the runner, late: the cancel stands
        assert (await store.get("resp_run", "o")).response == cancel.response
        assert await store.update(ended(running, "cancelled"), runner=True)  # its own cancelled object, output made
        assert (await store.get("resp_run", "o")).response["output"] != []
        assert not await store.update(ended(running, "cancelled"), runner=True)  # once: the run has ended
        await store.create(row("resp_gone", "in_progress"))
        assert await store.delete("resp_gone", "o")
        assert not await store.update(ended(row("resp_gone"), "completed"), runner=True)
        assert await store.get("resp_gone", "o") is None and await store.usage("o") == (
            ended(running, "cancelled").size()[0], 2)  # fmt: skip
        await store.create(row("resp_done"))
        for runner in (False, True):  # a finished one is never overwritten
            assert not await store.update(ended(row("resp_done"), "cancelled"), runner=runner)
        assert (await store.get("resp_done", "o")).response == row("resp_done").response

    run(go())


def test_two_replicas_a_delete_wins_over_a_late_runner(stores):
    """Replica A runs the response; B deletes it; A's final write comes after: nothing comes back."""

    async def go() -> None:
        a, b = stores(), stores()
        await a.create(row("resp_x", "queued"))
        assert await a.update(ended(row("resp_x"), "in_progress"), runner=True)
        assert await b.delete("resp_x", "o")
        assert not await a.update(ended(row("resp_x"), "completed"), runner=True)
        assert await a.heartbeat("resp_x") is None  # the runner learns of it
        assert await a.get("resp_x", "o") is None and await b.get("resp_x", "o") is None
        for attempt in range(8):  # the same race, both at once: whichever lands first, the row ends deleted
            name = f"resp_race_{attempt}"
            await a.create(row(name, "in_progress"))
            await asyncio.gather(a.update(ended(row(name), "completed"), runner=True), b.delete(name, "o"))
            assert await a.get(name, "o") is None

    run(go())


def test_two_replicas_a_cancel_never_overwrites_a_completion(stores):
    """A completes, then B's cancel (made from what B read before) comes: B answers the completed one."""

    async def go() -> None:
        a, b = stores(), stores()
        await a.create(row("resp_y", "in_progress"))
        seen_by_b = await b.get("resp_y", "o")
        assert await a.update(ended(row("resp_y"), "completed"), runner=True)
        assert not await b.update(ended(seen_by_b, "cancelled"))
        assert (await b.get("resp_y", "o")).response["status"] == "completed"
        for attempt in range(8):  # both at once: exactly one wins, and the row holds the winner
            name = f"resp_race_{attempt}"
            await a.create(row(name, "in_progress"))
            done, cancelled = await asyncio.gather(a.update(ended(row(name), "completed"), runner=True),
                                                   b.update(ended(row(name), "cancelled")))  # fmt: skip
            assert done != cancelled
            assert (await a.get(name, "o")).response["status"] == ("completed" if done else "cancelled")
            assert await a.heartbeat(name) == ("completed" if done else "cancelled")

    run(go())


def test_fail_stale_fails_only_unfinished_rows_whose_lease_lapsed(stores):
    async def go() -> None:
        store = stores()
        for response_id, status in (("queued", "queued"), ("running", "in_progress"), ("done", "completed"),
                                    ("cancelled", "cancelled"), ("alive", "in_progress")):  # fmt: skip
            await store.create(row(response_id, status, owner=f"owner-{response_id}"))
        await asyncio.sleep(0.05)
        before = time.time()
        await asyncio.sleep(0.05)
        assert await store.heartbeat("alive") == "in_progress"  # its replica's heartbeat, after ``before``
        assert await store.heartbeat("resp_absent") is None  # renewing nothing is no error
        assert await store.fail_stale(before, ERROR) == 2
        for response_id in ("queued", "running"):
            failed = (await store.get(response_id, f"owner-{response_id}")).response
            assert failed["status"] == "failed" and failed["error"] == ERROR and failed["id"] == response_id
            assert await store.heartbeat(response_id) == "failed"  # its runner, if alive, stops
        for response_id, status in (("done", "completed"), ("cancelled", "cancelled"), ("alive", "in_progress")):
            kept = (await store.get(response_id, f"owner-{response_id}")).response
            assert kept["status"] == status and kept["error"] is None
        assert await store.fail_stale(before, ERROR) == 0  # failed rows are finished
        assert await store.fail_stale(time.time() + 1, ERROR) == 1  # the live one, once it stops renewing

    run(go())


def test_a_running_response_outlives_a_short_ttl_and_its_conversation_with_it(stores):
    """``--responses-ttl`` shorter than a run: the heartbeat keeps it (and the turns it continues)."""

    async def go() -> None:
        store = stores(ttl=1.0)
        await store.create(row("resp_first"))
        await store.create(row("resp_long", "in_progress", previous="resp_first"))
        for _ in range(8):  # 1.6 s, longer than the time to live
            await asyncio.sleep(0.2)
            assert await store.heartbeat("resp_long") == "in_progress"
        await store.create(row("resp_other"))  # a write deletes what expired: not this conversation
        assert await store.get("resp_first", "o") is None  # past its own time to live
        assert await store.update(ended(row("resp_long", previous="resp_first"), "completed"), runner=True)
        assert len((await store.conversation("resp_long", "o")).items) == 4  # its first turn's items kept
        await asyncio.sleep(1.1)
        assert await store.get("resp_long", "o") is None  # expired from its last write
        await store.create(row("resp_later"))
        assert await store.usage("o") == (row("resp_later").size()[0], 2)  # the whole conversation went

    run(go())


# ---- SQLite only ------------------------------------------------------------------------------------
def test_the_sqlite_file_keeps_its_schema_version_and_refuses_a_newer_one(tmp_path):
    run(SqliteResponseStore(tmp_path / "r.db").create(row("resp_1")))
    db = sqlite3.connect(tmp_path / "r.db")
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)] == [(3,)]
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    db.commit()
    with pytest.raises(RuntimeError, match="schema version"):
        run(SqliteResponseStore(tmp_path / "r.db").get("x", ""))


def test_the_heartbeat_never_rewrites_the_response_row(tmp_path: Path):
    store = SqliteResponseStore(tmp_path / "r.db")
    run(store.create(row("resp_big", "in_progress", text="x" * 100_000)))
    db = sqlite3.connect(tmp_path / "r.db")
    db.executescript("CREATE TABLE written (id TEXT); CREATE TRIGGER spy AFTER UPDATE ON responses BEGIN "
                     "INSERT INTO written VALUES (NEW.id); END;")  # fmt: skip
    db.close()

    async def go() -> list:
        return [await store.heartbeat("resp_big") for _ in range(5)]

    assert run(go()) == ["in_progress"] * 5
    store.close()
    assert sqlite3.connect(tmp_path / "r.db").execute("SELECT count(*) FROM written").fetchone() == (0,)


VERSION_1 = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version (version) VALUES (1);
CREATE TABLE responses (id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at REAL NOT NULL, expires_at REAL,
                        response TEXT NOT NULL, input_items TEXT NOT NULL, conversation TEXT NOT NULL);
CREATE INDEX responses_expiry ON responses (expires_at);
"""
VERSION_2 = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version (version) VALUES (2);
CREATE TABLE responses (id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
                        expires_at REAL, status TEXT NOT NULL, response TEXT NOT NULL, input_items TEXT NOT NULL,
                        conversation TEXT NOT NULL);
CREATE INDEX responses_expiry ON responses (expires_at);
CREATE INDEX responses_unfinished ON responses (status, updated_at);
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
        assert await store.fail_stale(1500.0, ERROR) == 0  # its lease is its last write: 2000 is not before 1500
        assert await store.fail_stale(2500.0, ERROR) == 1
        assert (await store.get("resp_stuck", "o")).response["status"] == "failed"
        await store.create(row("resp_new", "queued"))
        store.close()

    run(go())
    db = sqlite3.connect(path)
    assert db.execute("SELECT version FROM schema_version").fetchall() == [(3,)]
    statuses = dict(db.execute("SELECT id, status FROM responses").fetchall())
    assert statuses == {"resp_old": "completed", "resp_stuck": "failed", "resp_new": "queued"}
    assert db.execute("SELECT updated_at FROM responses WHERE id = 'resp_old'").fetchone() == (1000.0,)
    run(SqliteResponseStore(path).get("resp_old", "o"))  # a second open finds version 3: nothing to migrate


def test_a_version_2_file_is_migrated_in_place_and_its_conversations_continue(tmp_path: Path):
    """Version 2 copied the conversation into every row: those rows stay readable, continuable and
    counted; their output moves to its own column."""
    path = tmp_path / "v2.db"
    db = sqlite3.connect(path)
    db.executescript(VERSION_2)
    first, second = row("resp_1"), row("resp_2")
    earlier = first.input_items + first.response["output"]
    for stored, conversation in ((first, first.input_items), (second, earlier + second.input_items)):
        db.execute("INSERT INTO responses VALUES (?, 'o', 1.0, 1.0, NULL, 'completed', ?, ?, ?)",
                   (stored.id, json.dumps(stored.response), json.dumps(stored.input_items),
                    json.dumps(conversation)))  # fmt: skip
    db.commit()
    db.close()

    async def go() -> None:
        store = SqliteResponseStore(path)
        assert (await store.get("resp_2", "o")).response == second.response
        assert ids((await store.get("resp_2", "o")).input_items) == ["in_resp_2"]
        assert ids((await store.conversation("resp_2", "o")).items) == ["in_resp_1", "out_resp_1", "in_resp_2",
                                                                        "out_resp_2"]  # fmt: skip
        await store.create(row("resp_3", previous="resp_2"))  # a new turn on a version-2 row
        assert ids((await store.conversation("resp_3", "o")).items)[-4:] == ["in_resp_2", "out_resp_2", "in_resp_3",
                                                                             "out_resp_3"]  # fmt: skip
        assert (await store.usage("o"))[1] == 2 + 4 + 2  # a version-2 row counts its copied conversation
        assert await store.delete("resp_2", "o") and len((await store.conversation("resp_3", "o")).items) == 6
        store.close()

    run(go())
    assert sqlite3.connect(path).execute("SELECT version FROM schema_version").fetchall() == [(3,)]
