"""Background responses: ``background: true`` runs the response from a task the app owns, not from
the request that created it, so its creator may go away (a poll, a resumed stream or a cancel comes
back for it by id).

``POST /v1/responses`` stores the response as ``queued`` and starts a ``BackgroundRun``: one
engine request in the same continuous batch as every other, whose events go to the run's
``EventLog`` and whose status goes to the store at each change: ``in_progress`` when the runner
starts, then ``completed``, ``incomplete``, ``failed`` or ``cancelled``. While it runs the runner
heart-beats its row (``ResponseStore.touch``) every ``heartbeat_seconds``; a row whose replica stopped
stops being touched, and once its heartbeat is older than ``--responses-lease`` it is stored as
failed (``fail_stale``: at start-up, and when a read finds it unfinished and not running here).

Cancelling closes the run's engine streams, the abort path of a client that hangs up
(``server.output.streaming.merge``), and stores the output made so far as ``cancelled``. A response
running on another replica is cancelled through the store: its runner reads its row at each
heartbeat and stops when the row says ``cancelled`` (or is gone: deleted).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from decoding import RequestOutput
from server.api.responses.event_log import EventLog
from server.api.responses.events import ResponseEvents, failure
from server.api.responses.replay import recorded, replayed_events
from server.api.responses.store import UNFINISHED, ResponseStore, StoredResponse, stored_size
from server.http.errors import from_output
from server.http.limits import CallerHold
from server.output.streaming import merge

logger = logging.getLogger(__name__)

STOPPED = {"code": "server_error", "message": "the replica running this response stopped before it finished"}
POLL_SECONDS = 0.5  # how often a stream resumed on another replica than the run's reads the row


def heartbeat_seconds(lease: float) -> float:
    """A few heartbeats per lease, so one late write never fails a live response."""
    return min(5.0, lease / 4)


async def fail_stale(store: ResponseStore, lease: float) -> int:
    """Store every unfinished response whose replica stopped heart-beating a lease ago as failed."""
    return await store.fail_stale(time.time() - lease, STOPPED)


class BackgroundRun:
    """One background response running on this replica: its engine streams, its events, its task."""

    def __init__(
        self, row: StoredResponse, events: ResponseEvents, streams: list[AsyncIterator[RequestOutput]],
        store: ResponseStore, *, heartbeat: float, max_bytes: int = 0,
    ) -> None:  # fmt: skip
        self.row, self.events, self.streams, self.store = row, events, streams, store
        self.heartbeat, self.max_bytes = heartbeat, max_bytes
        self.log = EventLog()
        self.log.extend(events.queued())
        self.task: asyncio.Task | None = None
        self.started = False  # the runner ran: the response went in_progress
        self.finishing = False  # the output is final: a cancel now returns it unchanged
        self.abandoned = False  # the server is stopping: the run ends as failed
        self.deleted = False  # its row is gone: nothing is written back
        self.final: dict[str, Any] | None = None

    @property
    def response_id(self) -> str:
        return self.row.id

    async def run(self) -> None:
        self.started = True
        self.log.extend(self.events.in_progress())
        beat = asyncio.create_task(self._beat())
        try:
            await self._write(self.events.builder.response("in_progress", []))
            async with aclosing(merge(self.streams)) as merged:  # closing it aborts the engine request
                async for _, output in merged:
                    if output.error:
                        raise from_output(output)
                    self.log.extend(self.events.feed(output))
            closing, response = self.events.finish()
        except asyncio.CancelledError:
            closing, response = self.events.interrupted(*self._stop_reason())
        except Exception as exc:
            closing, response = self.events.interrupted("failed", failure(exc, self.response_id))
        finally:
            beat.cancel()
        self.finishing = True
        self.log.extend(closing)
        await self._finish(response)

    def _stop_reason(self) -> tuple[str, dict[str, Any] | None]:
        return ("failed", STOPPED) if self.abandoned else ("cancelled", None)

    async def cancel(self) -> dict[str, Any]:
        """Abort the run and store what it made as cancelled; a finished run's response, unchanged."""
        if self.task is not None and not self.finishing:
            self.task.cancel()
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)
        if self.final is None:  # cancelled before its first line ran: end it here
            for stream in self.streams:
                await stream.aclose()  # the engine's abort, as merge's close does
            self.finishing = True
            closing, response = self.events.interrupted(*self._stop_reason())
            self.log.extend(closing)
            await self._finish(response)
        assert self.final is not None
        return self.final

    async def _finish(self, response: dict[str, Any]) -> None:
        """Store the final object, then send its event (a reader of it can retrieve it at once)."""
        stored = recorded(response, self.events, self.started)
        if self.max_bytes and stored_size(self._row(stored)) > self.max_bytes:
            response = self.events.builder.response("failed", [], error={
                "code": "response_too_large", "message": f"the response is larger than a stored response may be "
                f"({self.max_bytes} bytes, --responses-max-bytes)"})  # fmt: skip
            stored = recorded(response, self.events, self.started)
        await self._write(stored)
        self.final = response
        self.log.extend([self.events.final_event(response)])
        self.log.close()

    def _row(self, response: dict[str, Any]) -> StoredResponse:
        return StoredResponse(self.row.id, self.row.owner, response, self.row.input_items, self.row.conversation)

    async def _write(self, response: dict[str, Any]) -> None:
        if self.deleted:
            return
        try:
            await self.store.put(self._row(response))
        except Exception:  # the store is down: the lease fails the row once it is back
            logger.exception("background response %s: storing its %s status failed", self.row.id,
                             response["status"])  # fmt: skip

    async def _beat(self) -> None:
        """Touch the row every ``heartbeat`` seconds; stop the run if another replica cancelled or
        deleted it."""
        while True:
            await asyncio.sleep(self.heartbeat)
            try:
                await self.store.touch(self.row.id)
                found = await self.store.get(self.row.id, self.row.owner)
            except Exception:
                logger.exception("background response %s: heartbeat failed", self.row.id)
                continue
            if found is None or found.response["status"] == "cancelled":
                self.deleted = found is None
                if self.task is not None and not self.finishing:
                    self.task.cancel()
                return


class BackgroundRuns:
    """The background responses this replica runs, by id; the app owns it, so a run outlives the
    request that started it."""

    def __init__(self) -> None:
        self.runs: dict[str, BackgroundRun] = {}

    def start(self, run: BackgroundRun, hold: CallerHold | None = None) -> None:
        """Run it; ``hold`` (its caller's rows under ``--max-concurrency-per-key``) is released when it ends."""
        run.task = asyncio.get_running_loop().create_task(run.run(), name=f"background {run.response_id}")
        self.runs[run.response_id] = run
        run.task.add_done_callback(lambda _: self._ended(run))
        if hold is not None:
            run.task.add_done_callback(lambda _: hold.release())

    def _ended(self, run: BackgroundRun) -> None:
        if run.final is None and not run.started:  # cancelled before it ran: ``cancel`` ends it, then drops it
            return
        if self.runs.get(run.response_id) is run:
            del self.runs[run.response_id]

    def get(self, response_id: str) -> BackgroundRun | None:
        return self.runs.get(response_id)

    async def cancel(self, run: BackgroundRun) -> dict[str, Any]:
        response = await run.cancel()
        self._ended(run)
        return response

    async def stop(self, timeout: float) -> None:
        """At shutdown: wait up to ``timeout`` for the runs (the engine drains them), then end the rest
        as failed (their replica stopped) rather than leave them to the lease."""
        tasks = [run.task for run in self.runs.values() if run.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        for run in list(self.runs.values()):
            run.abandoned = True
            await self.cancel(run)


async def resumed_events(runs: BackgroundRuns, store: ResponseStore, found: StoredResponse, after: int,
                         lease: float) -> AsyncIterator[dict[str, str]]:  # fmt: skip
    """The events of background response ``found`` after sequence number ``after``: followed live
    when it runs here, else rebuilt from its final object (waiting for it while another replica runs it)."""
    run = runs.get(found.id)
    if run is not None:
        async for event in run.log.follow(after):
            yield event
        return
    response = found.response
    while response["status"] in UNFINISHED:
        await asyncio.sleep(POLL_SECONDS)
        await fail_stale(store, lease)
        again = await store.get(found.id, found.owner)
        if again is None:  # deleted while running
            return
        response = again.response
    for event in replayed_events(response)[after + 1 :]:
        yield event
