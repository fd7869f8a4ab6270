"""The responses store failing under a live server, and coming back without a restart.

SQLite whose file turns read-only or full while a reply is generated (``PRAGMA query_only`` and
``max_page_count`` on the store's own connection: the errors a read-only mount or a full disk give):
the client still gets its answer, the store's failure named (a header, or an ``error`` event before
the final one), nothing stored, and the next request stores again. A background run whose final
write fails is retried, and a run that cannot store says so in its stream. A background run longer
than ``--responses-ttl`` keeps its row; a stream resumed on another replica polls the status, not
the object. PostgreSQL stopped and started under traffic (a cluster of the test's own, as
``.ci/run`` makes one): 503 with ``Retry-After`` while it is down, every reply a 200 or that 503,
service back without restarting Decoda, and no row half-written.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest

from server.api.responses import background
from server.api.responses.store_sqlite import SqliteResponseStore
from server.app import create_app
from server.config.settings import Settings
from tests.test_api import run
from tests.test_responses_api import RESPONSES, RecordingEngine, Server, sse_events
from tests.test_responses_background import PiecesEngine, Replica

BREAKS = {
    "read-only": lambda db: db.execute("PRAGMA query_only = ON"),
    "full": lambda db: db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0]}"),
}


def break_store(store: SqliteResponseStore, how: str) -> None:
    """The store's file refuses writes from now on (until its connection is opened again)."""
    with store._lock:
        assert store._connection is not None
        BREAKS[how](store._connection)


class BreakingEngine(RecordingEngine):
    """Answers ``reply``; ``on_generate`` (when set) runs as each request starts generating."""

    def __init__(self, reply: str) -> None:
        super().__init__(reply)
        self.on_generate: Callable[[], None] | None = None

    async def _scripted(self, request_id: str, prompt_ids: list[int]) -> AsyncIterator:
        if self.on_generate is not None:
            self.on_generate()
        async for output in super()._scripted(request_id, prompt_ids):
            yield output


@pytest.mark.parametrize("how", sorted(BREAKS))
@pytest.mark.parametrize("stream", [False, True])
def test_a_store_that_refuses_the_row_after_generation_still_answers_and_names_the_failure(tmp_path, how, stream):
    engine = BreakingEngine("Paris.")
    server = Server(tmp_path, engine)
    server.create({"input": "warm up"})  # the store's connection is open
    engine.on_generate = lambda: break_store(server.app.state.responses_store, how)
    answer = server.call("POST", RESPONSES, {"input": "x" * 20_000, "stream": stream})  # one token, many pages
    engine.on_generate = None
    assert answer.status_code == 200
    if stream:
        events = sse_events(answer.text)
        (name, error), (last, final) = events[-2:]
        assert (name, error["param"], error["code"]) == ("error", "store", "responses_store_unavailable")
        assert ("readonly" if how == "read-only" else "full") in error["message"]
        assert last == "response.completed" and final["response"]["store"] is False
        body = final["response"]
    else:
        body = answer.json()
        failure = answer.headers["x-decoda-store-error"]
        assert failure.startswith("responses_store_unavailable: ") and "SQLite" in failure
        assert ("readonly" if how == "read-only" else "full") in failure
    assert body["status"] == "completed" and body["output"][0]["content"][0]["text"] == "Paris."
    assert body["store"] is False and server.call("GET", f"{RESPONSES}/{body['id']}").status_code == 404
    again = server.create({"input": "x" * 20_000})  # the file was fixed: served again, no restart
    assert again["store"] is True and server.call("GET", f"{RESPONSES}/{again['id']}").json() == again


class BreakingPieces(PiecesEngine):
    """``PiecesEngine`` that runs ``before_last`` just before its last piece."""

    before_last: Callable[[], None] | None = None

    async def _scripted(self, request_id: str, prompt_ids: list[int]) -> AsyncIterator:
        outputs = [output async for output in super()._scripted(request_id, prompt_ids)]
        for output in outputs:
            if output.finished and self.before_last is not None:
                self.before_last()
            yield output


def test_a_background_run_whose_final_write_fails_stores_it_on_a_later_try(tmp_path):
    async def go() -> None:
        engine = BreakingPieces("the answer", pieces=4)
        replica = Replica(tmp_path, engine, responses_lease=0.2)
        engine.before_last = lambda: break_store(replica.store, "read-only")
        created = await replica.create()
        final = await replica.finished(created["id"])
        assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == "the answer"

    run(go())


def test_a_background_run_that_cannot_store_its_end_says_so_in_its_stream(tmp_path, monkeypatch):
    monkeypatch.setattr(background, "FINAL_WRITE_TRIES", 1)

    async def go() -> list:
        engine = BreakingPieces("the answer", pieces=4)
        replica = Replica(tmp_path, engine, responses_lease=0.2)
        engine.before_last = lambda: break_store(replica.store, "read-only")
        return (await replica.create(stream=True))["events"]

    events = run(go())
    (name, error), (last, final) = events[-2:]
    assert (name, error["param"], error["code"]) == ("error", "store", "responses_store_unavailable")
    assert last == "response.completed" and final["response"]["output"][0]["content"][0]["text"] == "the answer"


def test_a_background_run_longer_than_the_ttl_keeps_its_row_and_its_result(tmp_path):
    async def go() -> None:
        engine = PiecesEngine("one two three four five six seven eight nine ten", pieces=10, delay=0.1)
        replica = Replica(tmp_path, engine, responses_ttl=0.3, responses_lease=0.2)
        created = await replica.create()
        final = await replica.finished(created["id"])  # 1 s: more than three times the time to live
        assert final["status"] == "completed" and final["output"][0]["content"][0]["text"].startswith("one two")
        assert engine.aborted == []

    run(go())


def test_a_stream_resumed_on_another_replica_polls_the_status_not_the_object(tmp_path):
    async def go() -> None:
        runner = Replica(tmp_path, PiecesEngine("a b c d e f g h i j k l m n o p q r s t", pieces=20, delay=0.1),
                         responses_lease=0.4)  # fmt: skip
        other = Replica(tmp_path, responses_lease=0.4)
        created = await runner.create()
        events = await other.events(created["id"])  # 2 s of polling, every 0.5 s
        assert events == await runner.events(created["id"])
        assert other.store.gets == 2  # the first read and the final object: every poll read the status alone

    run(go())


# ---- PostgreSQL stopped and started under traffic -------------------------------------------------------
def pg_bin() -> Path | None:
    """The PostgreSQL server programs' folder (Debian's versioned one first), or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    pg_ctl = shutil.which("pg_ctl")
    return Path(pg_ctl).resolve().parent if pg_ctl else None


class Cluster:
    """A throwaway PostgreSQL cluster on a free loopback port (as ``.ci/run`` starts one), run as the
    ``postgres`` user when the tests run as root (the server refuses root)."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="decoda-pg-restart-"))
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
        if self.as_user:
            shutil.chown(self.root, "postgres")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._run("initdb", "-D", str(self.root / "data"), "-U", "postgres", "-A", "trust", "--no-sync")

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run([*self.as_user, str(self.bin / tool), *args], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
        self._run("pg_ctl", "-D", str(self.root / "data"), "-l", str(self.root / "server.log"), "-w", "-t", "60",
                  "start", "-o", options)  # fmt: skip

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass  # already stopped
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    bin_dir = pg_bin()
    if bin_dir is None or not (bin_dir / "initdb").exists():
        pytest.skip("PostgreSQL's server programs are not installed (Debian package postgresql; .ci/run installs it)")
    made = Cluster(bin_dir)
    try:
        made.start()
        yield made
    finally:
        made.remove()


def test_postgresql_stopped_and_started_under_traffic_is_a_503_then_serves_again(cluster):
    app = create_app(Settings(responses_store=cluster.url), engine_client=RecordingEngine(reply="Paris."))
    answers: list[httpx.Response] = []

    async def traffic(http: httpx.AsyncClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            answers.append(await http.post(RESPONSES, json={"input": "Capital of France?"}))
            await asyncio.sleep(0.01)

    async def go() -> tuple:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            first = (await http.post(RESPONSES, json={"input": "Capital of France?"})).json()
            stop = asyncio.Event()
            load = asyncio.create_task(traffic(http, stop))
            await asyncio.sleep(0.3)
            await asyncio.to_thread(cluster.stop)
            down = [await http.get(f"{RESPONSES}/{first['id']}"),
                    await http.post(RESPONSES, json={"input": "more", "previous_response_id": first["id"]}),
                    await http.post(RESPONSES, json={"input": "new"})]  # fmt: skip
            await asyncio.to_thread(cluster.start)
            back = None
            for _ in range(50):
                back = await http.get(f"{RESPONSES}/{first['id']}")
                if back.status_code == 200:
                    break
                assert back.status_code == 503, back.text
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.3)
            stop.set()
            await load
            continued = await http.post(RESPONSES, json={"input": "more", "previous_response_id": first["id"]})
            stored = {}
            for answer in answers:
                if answer.status_code == 200 and answer.json()["store"]:
                    found = await http.get(f"{RESPONSES}/{answer.json()['id']}")
                    stored[answer.json()["id"]] = found.status_code == 200 and found.json() == answer.json()
            await app.state.responses_store.close()
            return first, down, back, continued, stored

    first, down, back, continued, stored = asyncio.run(go())
    for refused in down:
        assert refused.status_code == 503 and refused.headers["Retry-After"], refused.text
        assert refused.json()["error"]["code"] == "responses_store_unavailable"
        assert "PostgreSQL" in refused.json()["error"]["message"]
    assert back.status_code == 200 and back.json() == first  # no restart of Decoda
    assert continued.status_code == 200 and continued.json()["status"] == "completed"
    codes = {answer.status_code for answer in answers}
    assert codes <= {200, 503} and 503 in codes and answers[-1].status_code == 200
    for answer in answers:  # a 200 said whether it was stored, and it was exactly then
        if answer.status_code == 200:
            assert answer.json()["store"] is ("x-decoda-store-error" not in answer.headers)
    assert stored and all(stored.values())
