"""The responses store on PostgreSQL beyond the contract ``tests/test_responses_store.py`` runs on it: its
columns, time to live, every store on one database sharing rows (two apps continuing each other's
conversations), its schema made once when replicas open it together, a newer schema refused, text
without U+0000; then choosing the store by URL, checking the URL at start, a database that cannot be
reached (a 503, no password shown) and closing the store at shutdown.

The tests that need a database skip without ``DECODA_TEST_POSTGRES_URL`` (``.ci/run`` sets it).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from server.api.responses.store import SqliteResponseStore, StoredResponse
from server.api.responses.store_postgres import SCHEMA_VERSION, PostgresResponseStore, encode_json
from server.api.responses.stores import close_store, open_store
from server.app import create_app
from server.config.settings import Settings
from server.http.errors import APIError
from tests.postgres import POSTGRES_URL, SKIP_REASON, execute, fresh_schema
from tests.test_responses_api import RESPONSES, RecordingEngine

DIED = {"code": "server_error", "message": "the replica running this response stopped"}


def row(response_id: str, owner: str = "", status: str = "completed", text: str = "hi") -> StoredResponse:
    message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
    response = {"id": response_id, "object": "response", "status": status, "output": [message]}
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}]
    return StoredResponse(response_id, owner, response, items, list(items))


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
def test_the_columns_an_upsert_touch_and_fail_stale_write(url):
    """``status`` follows the response, ``created_at`` is the first write's, ``updated_at`` the last's."""

    async def work(store: PostgresResponseStore) -> None:
        await store.put(row("resp_a", status="in_progress"))
        await store.put(row("resp_b", status="queued"))
        await asyncio.sleep(0.01)
        await store.put(row("resp_a", text="done"))
        await store.touch("resp_b")

    in_store(url, work)
    assert column(url, "status", "resp_a") == "completed" and column(url, "status", "resp_b") == "queued"
    for response_id in ("resp_a", "resp_b"):
        assert column(url, "updated_at", response_id) > column(url, "created_at", response_id)
    assert in_store(url, lambda store: store.fail_stale(time.time() + 1, DIED)) == 1
    assert column(url, "status", "resp_b") == "failed"
    failed = {**row("resp_b").response, "status": "failed", "error": DIED}
    assert json.loads(column(url, "response", "resp_b")) == failed  # the JSON too (a raw read: text)


def test_rows_past_their_ttl_read_absent_and_the_next_write_deletes_them(url):
    async def work(store: PostgresResponseStore) -> tuple:
        await store.put(row("resp_old"))
        kept = await store.get("resp_old", "")
        await asyncio.sleep(0.4)
        expired = await store.get("resp_old", "")
        await store.put(row("resp_new"))
        return kept is not None, expired

    assert in_store(url, work, ttl=0.3) == (True, None)
    assert [r["id"] for r in asyncio.run(execute(url, "SELECT id FROM responses"))] == ["resp_new"]


def test_two_stores_on_one_database_see_each_others_rows(url):
    async def work(_: PostgresResponseStore) -> tuple:
        a, b = PostgresResponseStore(url), PostgresResponseStore(url)
        try:
            await a.put(row("resp_from_a", owner="k"))
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

    async def work(store: PostgresResponseStore) -> StoredResponse | None:
        await store.put(row("resp_text", text=text))
        return await store.get("resp_text", "")

    stored = in_store(url, work)
    assert stored.response["output"][0]["content"][0]["text"] == text.replace("\x00", "\ufffd")


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
    (messages, _), = b.templates[-1:]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert "Capital of France?" in json.dumps(messages[0]) and "Paris." in json.dumps(messages[1])


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


def test_a_u0000_escape_becomes_u_fffd_and_nothing_else_changes():
    value = {"a": "x\x00y", "b": "\\u0000", "c": "\\\x00", "d": ["\x00"]}
    assert json.loads(encode_json(value)) == {"a": "x\ufffdy", "b": "\\u0000", "c": "\\\ufffd", "d": ["\ufffd"]}


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
