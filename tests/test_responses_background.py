"""Background responses against the fake engine: queued at once, run by a task the app owns (a client
that hangs up does not stop it), each status written to the store, polled, cancelled (aborting the
engine request), resumed as a stream (live, or rebuilt from the store with the same events and
sequence numbers), and failed once their replica stops heart-beating for a lease. Each test runs on
one event loop, as a server does, since a run outlives the request that started it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from decoding import FinishReason, GenerationParams, RequestOutput, SequenceDelta, TokenLogprob, TopLogprob
from server.api.responses.background import STOPPED, BackgroundRun, BackgroundRuns
from server.api.responses.events import ResponseEvents
from server.api.responses.format import ResponseBuilder
from server.api.responses.replay import replayed_events
from server.api.responses.store import StoredResponse
from server.api.responses.store_sqlite import SqliteResponseStore
from server.app import create_app
from server.config.settings import Settings
from tests.asgi_driver import stream_then_hang_up
from tests.fake_engine import FakeEngineClient
from tests.test_api import error_of, run
from tests.test_responses_api import CALL_REPLY, WEATHER, RecordingEngine, sse_events

RESPONSES = "/v1/responses"
UNFINISHED = ("queued", "in_progress")


class PiecesEngine(RecordingEngine):
    """Generates ``reply`` in ``pieces`` deltas (with logprobs when asked), ``delay`` seconds apart."""

    def __init__(self, reply: str, pieces: int = 20, delay: float = 0.01) -> None:
        super().__init__(reply)
        self.pieces, self.delay = pieces, delay

    async def _scripted(self, request_id: str, prompt_ids: list[int]) -> AsyncIterator[RequestOutput]:
        params = self.submitted[-1][2]
        size = -(-len(self.reply) // self.pieces)
        chunks = [self.reply[i : i + size] for i in range(0, len(self.reply), size)]
        for index, chunk in enumerate(chunks):
            await asyncio.sleep(self.delay)
            last = index == len(chunks) - 1
            logprobs = None
            if params.logprobs is not None:
                logprobs = [TokenLogprob(index + 1, chunk, -0.25, [TopLogprob(index + 1, chunk, -0.25)])]
            delta = SequenceDelta(0, chunk, [index + 1], logprobs, FinishReason.STOP if last else None)
            yield RequestOutput(request_id, [delta], len(prompt_ids), index + 1, finished=last)


class SpyStore(SqliteResponseStore):
    """The SQLite store, keeping the status of every write and counting the reads of a whole row."""

    def __init__(self, path: Path, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.statuses: dict[str, list[str]] = {}
        self.gets = 0

    async def create(self, stored: StoredResponse) -> None:
        self.statuses.setdefault(stored.id, []).append(stored.response["status"])
        await super().create(stored)

    async def update(self, stored: StoredResponse, runner: bool = False) -> bool:
        self.statuses.setdefault(stored.id, []).append(stored.response["status"])
        return await super().update(stored, runner)

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        self.gets += 1
        return await super().get(response_id, owner)


class Replica:
    """One app on the shared store file, driven through httpx on the test's one event loop."""

    def __init__(self, tmp_path: Path, engine: FakeEngineClient | None = None, **settings: Any) -> None:
        self.engine = engine or FakeEngineClient(delay=0.02)
        store = tmp_path / "responses.db"
        self.app = create_app(Settings(responses_store=f"sqlite:///{store}", **settings), engine_client=self.engine)
        self.store = self.app.state.responses_store = SpyStore(store, ttl=self.app.state.settings.responses_ttl)
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://test")

    async def create(self, **body: Any) -> dict:
        response = await self.http.post(RESPONSES, json={"input": "hello", "background": True, **body})
        assert response.status_code == 200, response.text
        return response.json() if not body.get("stream") else {"events": sse_events(response.text)}

    async def get(self, response_id: str, **query: Any) -> httpx.Response:
        return await self.http.get(f"{RESPONSES}/{response_id}", params=query or None)

    async def status(self, response_id: str) -> str:
        return (await self.get(response_id)).json()["status"]

    async def finished(self, response_id: str) -> dict:
        """Poll until the response is no longer queued or in progress."""
        await until(lambda: self._done(response_id))
        return (await self.get(response_id)).json()

    async def _done(self, response_id: str) -> bool:
        return await self.status(response_id) not in UNFINISHED

    async def events(self, response_id: str, **query: Any) -> list[tuple[str, dict]]:
        response = await self.get(response_id, stream="true", **query)
        assert response.status_code == 200, response.text
        return sse_events(response.text)


async def until(predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def names(events: list[tuple[str, dict]]) -> list[str]:
    return [name for name, _ in events]


# ---- create, poll, the store's statuses ---------------------------------------------------------------
def test_a_background_response_is_queued_at_once_and_polled_to_its_end(tmp_path):
    async def go() -> None:
        replica = Replica(tmp_path)
        created = await replica.create(max_output_tokens=5, metadata={"job": "1"})
        assert created["status"] == "queued" and created["background"] is True and created["output"] == []
        final = await replica.finished(created["id"])
        assert final["status"] == "incomplete" and final["background"] is True and final["metadata"] == {"job": "1"}
        assert final["output"][0]["content"][0]["text"] == "hello world foo bar baz"
        assert final["usage"]["output_tokens"] == 5 and "_decoda_stream" not in final
        assert replica.store.statuses[created["id"]] == ["queued", "in_progress", "incomplete"]
        assert replica.engine.finished == [f"{created['id']}-0"]

    run(go())


def test_a_client_that_hangs_up_does_not_stop_a_background_stream(tmp_path):
    async def go() -> None:
        replica = Replica(tmp_path)
        body = {"input": "hello", "background": True, "stream": True, "max_output_tokens": 8}
        (first,) = await stream_then_hang_up(replica.app, RESPONSES, body, after_chunks=1)
        ((name, data),) = sse_events(first.decode())
        assert name == "response.created" and data["response"]["status"] == "queued"
        final = await replica.finished(data["response"]["id"])
        assert final["status"] == "incomplete" and final["usage"]["output_tokens"] == 8
        assert replica.engine.aborted == [] and replica.engine.finished == [f"{final['id']}-0"]

    run(go())


# ---- cancel -------------------------------------------------------------------------------------------
def test_cancel_aborts_the_engine_request_and_keeps_the_output_so_far(tmp_path):
    async def go() -> None:
        replica = Replica(tmp_path, FakeEngineClient(delay=0.05))
        created = await replica.create(max_output_tokens=60)
        await asyncio.sleep(0.3)
        cancelled = (await replica.http.post(f"{RESPONSES}/{created['id']}/cancel")).json()
        assert cancelled["status"] == "cancelled" and replica.engine.aborted == [f"{created['id']}-0"]
        (message,) = cancelled["output"]
        assert message["status"] == "incomplete" and message["content"][0]["text"].startswith("hello world")
        assert 0 < cancelled["usage"]["output_tokens"] < 60
        assert (await replica.get(created["id"])).json() == cancelled
        assert (await replica.http.post(f"{RESPONSES}/{created['id']}/cancel")).json() == cancelled  # unchanged
        events = await replica.events(created["id"])
        assert names(events)[:3] == ["response.created", "response.queued", "response.in_progress"]
        assert names(events)[-4:] == ["response.output_text.done", "response.content_part.done",
                                      "response.output_item.done", "response.cancelled"]  # fmt: skip
        assert events[-1][1]["response"] == cancelled

    run(go())


def test_cancelling_a_finished_response_returns_it_unchanged(tmp_path):
    async def go() -> None:
        replica = Replica(tmp_path)
        final = await replica.finished((await replica.create(max_output_tokens=2))["id"])
        assert (await replica.http.post(f"{RESPONSES}/{final['id']}/cancel")).json() == final

    run(go())


def test_continuing_an_unfinished_background_response_is_a_400_until_it_finishes(tmp_path):
    async def go() -> None:
        replica = Replica(tmp_path, engine=PiecesEngine("a slow answer", pieces=20, delay=0.05))
        created = await replica.create()
        early = await replica.http.post(RESPONSES, json={"input": "and?", "previous_response_id": created["id"]})
        assert early.status_code == 400 and error_of(early)["param"] == "previous_response_id"
        assert error_of(early)["code"] == "previous_response_not_finished"
        await replica.finished(created["id"])
        later = await replica.http.post(RESPONSES, json={"input": "and?", "previous_response_id": created["id"]})
        assert later.status_code == 200, later.text

    run(go())


def test_a_background_response_counts_against_its_caller_until_it_ends(tmp_path):
    """--max-concurrency-per-key counts a background run's rows until the run ends, not its request."""

    async def go() -> None:
        replica = Replica(tmp_path, engine=PiecesEngine("a slow answer", pieces=20, delay=0.05),
                          max_concurrency_per_key=1)  # fmt: skip
        created = await replica.create()
        busy = await replica.http.post(RESPONSES, json={"input": "meanwhile", "max_output_tokens": 2})
        assert busy.status_code == 429, busy.text
        await replica.finished(created["id"])
        await until(lambda: _idle(replica))
        free = await replica.http.post(RESPONSES, json={"input": "now", "max_output_tokens": 2})
        assert free.status_code == 200, free.text

    run(go())


async def _idle(replica: Replica) -> bool:
    return not replica.app.state.responses_runs.runs if hasattr(replica.app.state, "responses_runs") else True


def test_cancel_refuses_a_foreground_response_and_404s_an_unknown_one(tmp_path):
    async def go() -> None:
        replica = Replica(tmp_path)
        foreground = (await replica.http.post(RESPONSES, json={"input": "hello", "max_output_tokens": 2})).json()
        refused = await replica.http.post(f"{RESPONSES}/{foreground['id']}/cancel")
        assert refused.status_code == 400
        assert error_of(refused)["message"] == "Only background responses can be cancelled"
        unknown = await replica.http.post(f"{RESPONSES}/resp_nope/cancel")
        assert unknown.status_code == 404 and error_of(unknown)["code"] == "response_not_found"

    run(go())


def test_a_run_cancelled_before_its_runner_started_ends_cancelled_and_replays_the_same(tmp_path):
    async def go() -> None:
        engine, store = FakeEngineClient(), SqliteResponseStore(tmp_path / "r.db")
        builder = ResponseBuilder("resp_early", "fake-model", {"background": True, "store": True})
        row = StoredResponse(builder.response_id, "", builder.response("queued", []), [])
        await store.create(row)
        streams = [engine.generate("resp_early-0", [1, 2], GenerationParams(max_new_tokens=4))]
        runs = BackgroundRuns()
        run_ = BackgroundRun(row, ResponseEvents(builder), streams, store, heartbeat=1.0)
        runs.start(run_)
        cancelled = await runs.cancel(run_)  # before the loop ran the runner's first line
        assert not run_.started and cancelled["status"] == "cancelled" and cancelled["output"] == []
        assert names(sse_events_of(run_.log.events)) == ["response.created", "response.queued", "response.cancelled"]
        stored = (await store.get("resp_early", "")).response
        assert replayed_events(stored) == run_.log.events and runs.get("resp_early") is None

    run(go())


def sse_events_of(events: list[dict[str, str]]) -> list[tuple[str, dict]]:
    return [(event["event"], json.loads(event["data"])) for event in events]


# ---- resuming the stream ------------------------------------------------------------------------------
def test_a_resumed_stream_is_the_live_one_from_the_log_the_store_and_another_replica(tmp_path):
    async def go() -> None:
        engine = PiecesEngine(CALL_REPLY)
        replica = Replica(tmp_path, engine)
        live = (await replica.create(stream=True, tools=[WEATHER], include=["message.output_text.logprobs"],
                                     top_logprobs=1))["events"]  # fmt: skip
        assert [data["sequence_number"] for _, data in live] == list(range(len(live)))
        assert names(live)[:3] == ["response.created", "response.queued", "response.in_progress"]
        assert "response.function_call_arguments.done" in names(live) and names(live)[-1] == "response.completed"
        deltas = [data for name, data in live if name == "response.output_text.delta"]
        assert len(deltas) > 1 and all(delta["logprobs"] for delta in deltas)
        response_id = live[0][1]["response"]["id"]
        assert await replica.events(response_id) == live  # the run has ended: rebuilt from the store
        assert await replica.events(response_id, starting_after=0) == live[1:]
        assert await replica.events(response_id, starting_after=6) == live[7:]
        assert await replica.events(response_id, starting_after=len(live)) == []
        restarted = Replica(tmp_path, PiecesEngine(CALL_REPLY))
        assert await restarted.events(response_id) == live
        assert live[-1][1]["response"] == (await restarted.get(response_id)).json()

    run(go())


def test_a_stream_resumed_while_running_follows_it_to_the_end(tmp_path):
    async def go() -> None:
        replica = Replica(tmp_path, PiecesEngine("one two three four five six seven eight", pieces=8, delay=0.05))
        created = await replica.create()
        await asyncio.sleep(0.12)
        followed = await replica.events(created["id"], starting_after=2)  # read from the live log
        assert names(followed)[-1] == "response.completed"
        assert followed == (await replica.events(created["id"]))[3:]

    run(go())


def test_stream_true_on_a_foreground_response_is_a_400_naming_stream(tmp_path):
    async def go() -> None:
        replica = Replica(tmp_path)
        foreground = (await replica.http.post(RESPONSES, json={"input": "hello", "max_output_tokens": 2})).json()
        refused = await replica.get(foreground["id"], stream="true")
        assert refused.status_code == 400 and error_of(refused)["param"] == "stream"
        assert (await replica.get(foreground["id"], stream="false")).json() == foreground

    run(go())


# ---- several replicas, a stopped replica, shutdown ----------------------------------------------------
def test_a_live_run_stays_in_progress_for_another_replica_which_can_resume_and_cancel_it(tmp_path):
    async def go() -> None:
        lease = {"responses_lease": 0.3}  # a heartbeat every 0.075 s
        runner = Replica(tmp_path, FakeEngineClient(delay=0.05), **lease)
        other = Replica(tmp_path, FakeEngineClient(), **lease)
        created = await runner.create(max_output_tokens=16)  # 0.8 s: longer than the lease
        resumed_elsewhere = asyncio.create_task(other.events(created["id"]))  # waits for the end, then replays
        seen = set()
        while (status := await other.status(created["id"])) in UNFINISHED:
            seen.add(status)
            await asyncio.sleep(0.05)
        assert status == "incomplete" and "in_progress" in seen  # never failed: its heartbeat kept it alive
        assert await resumed_elsewhere == await runner.events(created["id"])

        second = await runner.create(max_output_tokens=60)
        await asyncio.sleep(0.2)
        assert (await other.http.post(f"{RESPONSES}/{second['id']}/cancel")).json()["status"] == "cancelled"

        async def aborted() -> bool:
            return f"{second['id']}-0" in runner.engine.aborted

        await until(aborted)  # at the runner's next heartbeat
        final = await runner.finished(second["id"])
        assert final["status"] == "cancelled" and final["output"][0]["content"][0]["text"].startswith("hello")

    run(go())


def test_an_unfinished_response_whose_replica_stopped_is_failed_on_read_and_at_start(tmp_path):
    async def go() -> None:
        store = SqliteResponseStore(tmp_path / "responses.db")
        builder = ResponseBuilder("resp_read", "fake-model", {"background": True, "store": True})
        await store.create(StoredResponse("resp_read", "", builder.response("in_progress", []), []))
        await asyncio.sleep(0.3)
        replica = Replica(tmp_path, responses_lease=0.2)
        failed = (await replica.get("resp_read")).json()
        assert failed["status"] == "failed" and failed["error"] == STOPPED
        events = await replica.events("resp_read")
        assert names(events) == ["response.created", "response.queued", "response.in_progress", "response.failed"]

        await store.create(StoredResponse("resp_start", "", {**failed, "id": "resp_start", "status": "in_progress",
                                                             "error": None}, []))  # fmt: skip
        await asyncio.sleep(0.3)
        async with replica.app.router.lifespan_context(replica.app):  # the start-up sweep, before any read
            found = await store.get("resp_start", "")
            assert found.response["status"] == "failed" and found.response["error"] == STOPPED

    run(go())


def test_shutdown_ends_a_running_background_response_as_failed(tmp_path):
    async def go() -> None:
        replica = Replica(tmp_path, FakeEngineClient(delay=0.05), drain_timeout=0)
        async with replica.app.router.lifespan_context(replica.app):
            created = await replica.create(max_output_tokens=60)
            await asyncio.sleep(0.1)
        final = (await replica.get(created["id"])).json()
        assert final["status"] == "failed" and final["error"] == STOPPED
        assert replica.engine.aborted == [f"{created['id']}-0"]

    run(go())


def test_deleting_a_running_background_response_stops_it(tmp_path):
    async def go() -> None:
        replica = Replica(tmp_path, FakeEngineClient(delay=0.05))
        created = await replica.create(max_output_tokens=60)
        await asyncio.sleep(0.1)
        assert (await replica.http.delete(f"{RESPONSES}/{created['id']}")).status_code == 200
        assert replica.engine.aborted == [f"{created['id']}-0"]
        await asyncio.sleep(0.1)
        assert (await replica.get(created["id"])).status_code == 404  # the stopped run wrote nothing back

    run(go())
