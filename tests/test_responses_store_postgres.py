"""The responses store on PostgreSQL beyond the contract ``tests/test_responses_store.py`` runs on it: its
columns, time to live, every store on one database sharing rows (two apps continuing each other's
conversations), its schema made once when replicas open it together, a version-2 database migrated
in place, a newer schema refused, text without U+0000 or lone surrogates, a row the database refuses
after the answer was made (the client still gets it, the failure named); then choosing the store by
URL, checking the URL at start, a database that cannot be reached (a 503, no password shown) and
closing the store at shutdown.

The tests that need a database skip without ``DECODA_TEST_POSTGRES_URL`` (``.ci/run`` sets it).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator

import asyncpg
import httpx
import pytest

from server.api.responses.postgres_schema import SCHEMA_VERSION
from server.api.responses.store import StoredResponse
from server.api.responses.store_postgres import PostgresResponseStore, encode_json
from server.api.responses.store_sqlite import SqliteResponseStore
from server.api.responses.stores import close_store, open_store
from server.app import create_app
from server.config.settings import Settings
from server.http.errors import APIError
from tests.postgres import POSTGRES_URL, SKIP_REASON, execute, fresh_schema
from tests.test_responses_api import RESPONSES, RecordingEngine, sse_events

DIED = {"code": "server_error", "message": "the replica running this response stopped"}


def row(response_id: str, owner: str = "", status: str = "completed", text: str = "hi") -> StoredResponse:
    message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
    response = {"id": response_id, "object": "response", "status": status, "output": [message]}
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}]
    return StoredResponse(response_id, owner, response, items)


@pytest.fixture
def url() -> Iterator[str]:
    """A PostgreSQL URL whose tables start empty; the test skips, saying why, without a database."""
    if not POSTGRES_URL:
        pytest.skip(SKIP_REASON)
    with fresh_schema() as schema_url:
        yield schema_url


def in_store(url: str, work, ttl: float = 0.0):  # noqa: ANN001, ANN201
    """Run ``work(store)`` on one event loop, closing the store after."""

    async def go():  # noqa: ANN202
        store = PostgresResponseStore(url, ttl)
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(go())


def column(url: str, name: str, response_id: str) -> object:
    (found,) = asyncio.run(execute(url, f"SELECT {name} FROM responses WHERE id = $1", response_id))
    return found[0]


# ---- what tests/test_responses_store.py's contract (run on PostgreSQL too) does not see -----------------
def test_the_columns_an_update_a_heartbeat_and_fail_stale_write(url):
    """``status`` follows the response, ``created_at`` is the first write's, ``updated_at`` the last's;
    the heartbeat renews the lease, not the row; the output has its own column."""

    async def work(store: PostgresResponseStore) -> None:
        await store.create(row("resp_a", status="in_progress"))
        await store.create(row("resp_b", status="queued"))
        await asyncio.sleep(0.01)
        assert await store.update(row("resp_a", text="done"), runner=True)
        assert await store.heartbeat("resp_b") == "queued"

    in_store(url, work)
    assert column(url, "status", "resp_a") == "completed" and column(url, "status", "resp_b") == "queued"
    assert column(url, "updated_at", "resp_a") > column(url, "created_at", "resp_a")
    assert column(url, "updated_at", "resp_b") == column(url, "created_at", "resp_b")
    (lease,) = asyncio.run(execute(url, "SELECT renewed_at FROM responses_leases"))  # resp_a's went as it ended
    assert lease["renewed_at"] > column(url, "created_at", "resp_b")
    assert json.loads(column(url, "output", "resp_a"))[0]["content"][0]["text"] == "done"
    assert in_store(url, lambda store: store.fail_stale(time.time() + 1, DIED)) == 1
    assert column(url, "status", "resp_b") == "failed"
    failed = {**row("resp_b").response, "status": "failed", "error": DIED, "output": []}
    assert json.loads(column(url, "response", "resp_b")) == failed  # the JSON too (a raw read: text)


def test_rows_past_their_ttl_read_absent_and_the_next_write_deletes_them(url):
    async def work(store: PostgresResponseStore) -> tuple:
        await store.create(row("resp_old"))
        kept = await store.get("resp_old", "")
        await asyncio.sleep(0.4)
        expired = await store.get("resp_old", "")
        await store.create(row("resp_new"))
        return kept is not None, expired

    assert in_store(url, work, ttl=0.3) == (True, None)
    assert [r["id"] for r in asyncio.run(execute(url, "SELECT id FROM responses"))] == ["resp_new"]


def test_two_stores_on_one_database_see_each_others_rows(url):
    async def work(_: PostgresResponseStore) -> tuple:
        a, b = PostgresResponseStore(url), PostgresResponseStore(url)
        try:
            await a.create(row("resp_from_a", owner="k"))
            seen = await b.get("resp_from_a", "k")
            deleted = await b.delete("resp_from_a", "k")
            return seen, deleted, await a.get("resp_from_a", "k")
        finally:
            await a.close()
            await b.close()

    seen, deleted, after = in_store(url, work)
    assert seen == row("resp_from_a", owner="k") and deleted and after is None


def test_replicas_opening_a_new_database_together_create_the_schema_once(url):
    async def work(_: PostgresResponseStore) -> list:
        stores = [PostgresResponseStore(url) for _ in range(8)]
        try:
            return await asyncio.gather(*(store.get("resp_none", "") for store in stores))
        finally:
            await asyncio.gather(*(store.close() for store in stores))

    assert in_store(url, work) == [None] * 8
    assert [r["version"] for r in asyncio.run(execute(url, "SELECT version FROM schema_version"))] == [SCHEMA_VERSION]


def test_a_database_of_a_newer_schema_is_refused(url):
    in_store(url, lambda store: store.get("resp_none", ""))
    asyncio.run(execute(url, "UPDATE schema_version SET version = $1", SCHEMA_VERSION + 1))
    with pytest.raises(RuntimeError, match=f"schema version {SCHEMA_VERSION + 1}"):
        in_store(url, lambda store: store.get("resp_none", ""))


def test_text_round_trips_except_u0000_which_reads_back_as_u_fffd(url):
    text = 'quotes " and \\ backslashes, \\u0000 as six characters, \u00e9\U0001f600 and a NUL: \x00.'
    lone = "a lone surrogate \ud800 (and \udc00), as a JSON body may send one"

    async def work(store: PostgresResponseStore) -> tuple[StoredResponse | None, StoredResponse | None]:
        await store.create(row("resp_text", text=text))
        await store.create(row("resp_lone", text=lone))
        return await store.get("resp_text", ""), await store.get("resp_lone", "")

    stored, surrogates = in_store(url, work)
    assert stored.response["output"][0]["content"][0]["text"] == text.replace("\x00", "\ufffd")
    assert surrogates.response["output"][0]["content"][0]["text"] == lone.replace("\ud800", "\ufffd").replace(
        "\udc00", "\ufffd")  # fmt: skip


def test_two_replicas_on_one_database_continue_each_others_conversations(url):
    """Two apps (two replicas' worth: own engine, own store object) on one PostgreSQL URL: a response
    made on A is retrieved and continued on B, and B's prompt holds A's turn."""
    a, b = RecordingEngine(reply="Paris."), RecordingEngine(reply="About 2 million.")
    apps = [create_app(Settings(responses_store=url), engine_client=engine) for engine in (a, b)]

    async def go() -> tuple[dict, httpx.Response, dict]:
        clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") for app in apps]
        try:
            first = (await clients[0].post(RESPONSES, json={"input": "Capital of France?"})).json()
            retrieved = await clients[1].get(f"{RESPONSES}/{first['id']}")
            second = await clients[1].post(RESPONSES, json={"input": "How many people live there?",
                                                            "previous_response_id": first["id"]})  # fmt: skip
            return first, retrieved, second.json()
        finally:
            for client in clients:
                await client.aclose()
            for app in apps:
                await close_store(app.state.responses_store)

    first, retrieved, second = asyncio.run(go())
    assert retrieved.status_code == 200 and retrieved.json() == first
    assert second["status"] == "completed", second
    ((messages, _),) = b.templates[-1:]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert "Capital of France?" in json.dumps(messages[0]) and "Paris." in json.dumps(messages[1])


VERSION_2 = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
INSERT INTO schema_version (version) VALUES (2);
CREATE TABLE responses (id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION, status TEXT NOT NULL, response JSONB NOT NULL,
    input_items JSONB NOT NULL, conversation JSONB NOT NULL);
CREATE INDEX responses_expiry ON responses (expires_at);
CREATE INDEX responses_unfinished ON responses (updated_at) WHERE status IN ('queued', 'in_progress');
"""


async def script(url: str, text: str, *rows: tuple) -> None:
    """Run ``text`` (several statements), then insert ``rows`` into a version-2 ``responses``."""
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(text)
        for values in rows:
            await connection.execute("INSERT INTO responses VALUES ($1, '', 1.0, $2, NULL, $3, $4::jsonb, $5::jsonb, "
                                     "$6::jsonb)", *values)  # fmt: skip
    finally:
        await connection.close()


def test_a_version_2_database_is_migrated_in_place_and_its_conversations_continue(url):
    first, second, stuck = row("resp_1"), row("resp_2", text="second"), row("resp_stuck", status="in_progress")
    earlier = first.input_items + first.response["output"]
    rows = [(stored.id, updated, stored.response["status"], json.dumps(stored.response), json.dumps(stored.input_items),
             json.dumps(conversation)) for stored, updated, conversation in (
                (first, 1.0, first.input_items), (second, 1.0, earlier + second.input_items),
                (stuck, 5.0, stuck.input_items))]  # fmt: skip
    asyncio.run(script(url, VERSION_2, *rows))

    async def work(store: PostgresResponseStore) -> tuple:
        got = await store.get("resp_2", "")
        third = row("resp_3")
        await store.create(StoredResponse("resp_3", "", third.response, third.input_items, previous_id="resp_2"))
        conversation = await store.conversation("resp_3", "")
        return got, conversation, await store.usage(""), await store.fail_stale(3.0, DIED), await store.fail_stale(
            6.0, DIED)  # fmt: skip

    got, conversation, usage, early, late = in_store(url, work)
    assert got.response == second.response and got.input_items == second.input_items
    assert [item["content"][0]["text"] for item in conversation.items] == ["hello", "hi", "hello", "second",
                                                                           "hello", "hi"]  # fmt: skip
    assert usage[1] == 2 + 4 + 2 + 2 and (early, late) == (0, 1)  # a version-2 row counts its copied conversation
    assert [r["version"] for r in asyncio.run(execute(url, "SELECT version FROM schema_version"))] == [3]


def test_a_row_the_database_refuses_after_the_answer_was_made_still_answers_and_names_the_store(url):
    """A PostgreSQL error that is no lost connection (here a constraint): the body comes back with
    ``store: false`` and the failure in ``x-decoda-store-error``; a stream ends with an ``error`` event
    naming ``store`` and then its ``response.completed``; nothing of the row was written."""
    app = create_app(Settings(responses_store=url), engine_client=RecordingEngine(reply="Paris."))

    async def go() -> tuple[httpx.Response, httpx.Response, httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            assert (await http.post(RESPONSES, json={"input": "warm up"})).status_code == 200
            await app.state.responses_store.close()  # its pool reconnects after the constraint
            await execute(url, "ALTER TABLE responses ADD CONSTRAINT refuse CHECK (bytes < 0) NOT VALID")
            body = await http.post(RESPONSES, json={"input": "Capital of France?"})
            stream = await http.post(RESPONSES, json={"input": "Capital of France?", "stream": True})
            gone = await http.get(f"{RESPONSES}/{body.json()['id']}")
            await execute(url, "ALTER TABLE responses DROP CONSTRAINT refuse")
            again = await http.post(RESPONSES, json={"input": "Capital of France?"})
            await close_store(app.state.responses_store)
            return body, stream, gone, again

    body, stream, gone, again = asyncio.run(go())
    assert body.status_code == 200 and body.json()["output"][0]["content"][0]["text"] == "Paris."
    assert body.json()["store"] is False and "CheckViolationError" in body.headers["x-decoda-store-error"]
    events = sse_events(stream.text)
    (name, error), (last, final) = events[-2:]
    assert (name, error["param"], error["code"]) == ("error", "store", "responses_store_failed")
    assert last == "response.completed" and final["response"]["store"] is False
    assert gone.status_code == 404 and again.status_code == 200 and "x-decoda-store-error" not in again.headers
    assert again.json()["store"] is True
    assert asyncio.run(execute(url, "SELECT count(*) AS n FROM responses"))[0]["n"] == 2


# ---- choosing, checking, reaching, closing (no database needed) ---------------------------------------
@pytest.mark.parametrize("store_url", [
    "postgresql://decoda:secret@db:5432/decoda", "postgres://db/decoda", "postgresql://u@h1:5432,h2:5433/d",
    "postgresql://[::1]:5432/decoda?sslmode=disable", "postgresql:///decoda?host=/var/run/postgresql",
])  # fmt: skip
def test_postgresql_urls_are_accepted_and_open_the_postgres_store(store_url):
    settings = Settings(responses_store=store_url)
    settings.check()
    store = open_store(settings)
    assert isinstance(store, PostgresResponseStore) and store.url == store_url


@pytest.mark.parametrize("store_url", [
    "postgresql:/db/decoda", "postgresql://", "postgresql://db:port/decoda", "postgresql://db:99999/decoda",
    "postgresql://user:secret@db:5432", "postgresql://user:secret@db/decoda/extra", "mysql://user:secret@db/decoda",
])  # fmt: skip
def test_a_bad_store_url_fails_the_start_naming_the_flag_and_never_the_password(store_url):
    with pytest.raises(ValueError, match="--responses-store") as failure:
        Settings(responses_store=store_url).check()
    assert "secret" not in str(failure.value)


def test_sqlite_stays_the_default_and_sqlite_urls_open_the_sqlite_store(tmp_path):
    default = open_store(Settings(cache_dir=str(tmp_path)))
    assert isinstance(default, SqliteResponseStore) and default.path == tmp_path / "responses.db"
    named = open_store(Settings(responses_store=f"sqlite:///{tmp_path}/r.db", responses_ttl=5))
    assert isinstance(named, SqliteResponseStore) and (named.path, named.ttl) == (tmp_path / "r.db", 5)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_database_that_cannot_be_reached_is_a_503_naming_the_store_without_the_password():
    store = PostgresResponseStore(f"postgresql://decoda:secret@127.0.0.1:{closed_port()}/decoda")
    with pytest.raises(APIError) as failure:
        asyncio.run(store.get("resp_x", ""))
    error = failure.value
    assert (error.status, error.code) == (503, "responses_store_unavailable") and error.headers["Retry-After"]
    assert "PostgreSQL" in error.message and "127.0.0.1" in error.message and "secret" not in error.message


def test_a_u0000_or_lone_surrogate_becomes_u_fffd_and_nothing_else_changes():
    value = {"a": "x\x00y", "b": "\\u0000", "c": "\\\x00", "d": ["\x00"], "e": "\ud83d\ude00 \U0001f600",
             "f": "\ud800x\udfff", "g": "\\ud800"}  # fmt: skip
    assert json.loads(encode_json(value)) == {"a": "x\ufffdy", "b": "\\u0000", "c": "\\\ufffd", "d": ["\ufffd"],
                                              "e": "\U0001f600 \U0001f600", "f": "\ufffdx\ufffd",
                                              "g": "\\ud800"}  # fmt: skip


def test_the_store_is_closed_when_the_app_shuts_down(tmp_path):
    app = create_app(Settings(responses_store=f"sqlite:///{tmp_path}/r.db"), engine_client=RecordingEngine("ok"))

    async def go() -> tuple[bool, bool]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
                assert (await http.post(RESPONSES, json={"input": "hi"})).status_code == 200
            opened = app.state.responses_store._connection is not None
        return opened, app.state.responses_store._connection is None

    assert asyncio.run(go()) == (True, True)


def test_close_store_closes_plain_and_coroutine_closes():
    closed: list[str] = []

    class Plain:
        def close(self) -> None:
            closed.append("plain")

    class Pooled:
        async def close(self) -> None:
            closed.append("pooled")

    async def go() -> None:
        await close_store(Plain())
        await close_store(Pooled())
        await close_store(None)

    asyncio.run(go())
    assert closed == ["plain", "pooled"]
