"""Background responses: ``background: true`` runs the response from a task the app owns, not from
the request that created it, so its creator may go away (a poll, a resumed stream or a cancel comes
back for it by id).

``POST /v1/responses`` stores the response as ``queued`` and starts a ``BackgroundRun``: one
engine request in the same continuous batch as every other, whose events go to the run's
``EventLog`` and whose status goes to the store at each change: ``in_progress`` when the runner
starts, then ``completed``, ``incomplete``, ``failed`` or ``cancelled``. Each of those writes applies
only while the row is still unfinished (``ResponseStore.update``): a cancel or a delete made on
another replica wins over the runner, whose final event then says what the store holds. While it
runs the runner renews its lease (``ResponseStore.heartbeat``: a small row, never the response) every
``heartbeat_seconds``, which also keeps its conversation from expiring under it, however short
``--responses-ttl``; a row whose replica stopped stops being renewed, and once its lease is older
than ``--responses-lease`` it is stored as failed (``fail_stale``: at start-up, and when a read finds
it unfinished and not running here).

Cancelling closes the run's engine streams, the abort path of a client that hangs up
(``server.output.streaming.merge``), and stores the output made so far as ``cancelled``. A response
running on another replica is cancelled through the store: its runner learns of it from its next
heartbeat and stops. A final object the store cannot take (the store is down, its disk full) is
retried a few heartbeats long; if it still fails, the run's stream says so with an ``error`` event
naming ``store`` before its final event, and the lease fails the row once the store is back.
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
from server.api.responses.replay import public, recorded, replayed_events
from server.api.responses.store import UNFINISHED, ResponseStore, StoredResponse
from server.api.responses.storing import store_failure
from server.http.errors import APIError, from_output
from server.http.limits import CallerHold
from server.output.streaming import merge

logger = logging.getLogger(__name__)

STOPPED = {"code": "server_error", "message": "the replica running this response stopped before it finished"}
POLL_SECONDS = 0.5  # how often a stream resumed on another replica than the run's reads the row's status
FINAL_WRITE_TRIES = 3  # a final object the store refuses is tried again this often, a heartbeat apart


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
            if await self._write(self.events.builder.response("in_progress", [])) is False:
                await self._abort()  # cancelled, deleted or failed elsewhere before it started
                closing, response = self.events.interrupted("cancelled")
            else:
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

    async def _abort(self) -> None:
        for stream in self.streams:
            await stream.aclose()  # the engine's abort, as merge's close does

    def _stop_reason(self) -> tuple[str, dict[str, Any] | None]:
        return ("failed", STOPPED) if self.abandoned else ("cancelled", None)

    async def cancel(self) -> dict[str, Any]:
        """Abort the run and store what it made as cancelled; a finished run's response, unchanged."""
        if self.task is not None and not self.finishing:
            self.task.cancel()
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)
        if self.final is None:  # cancelled before its first line ran: end it here
            await self._abort()
            self.finishing = True
            closing, response = self.events.interrupted(*self._stop_reason())
            self.log.extend(closing)
            await self._finish(response)
        assert self.final is not None
        return self.final

    async def _finish(self, response: dict[str, Any]) -> None:
        """Store the final object, then send its event (a reader of it can retrieve it at once). If the
        store holds another end (a cancel or a lease's failure came first), that one is the response."""
        stored = recorded(response, self.events, self.started)
        if self.max_bytes and self._row(stored).size()[0] > self.max_bytes:
            response = self.events.builder.response("failed", [], error={
                "code": "response_too_large", "message": f"the response is larger than a stored response may be "
                f"({self.max_bytes} bytes, --responses-max-bytes)"})  # fmt: skip
            stored = recorded(response, self.events, self.started)
        written: bool | Exception = False
        for attempt in range(1 if self.abandoned else FINAL_WRITE_TRIES):
            written = await self._write(stored)
            if not isinstance(written, Exception):
                break
            if attempt + 1 < FINAL_WRITE_TRIES and not self.abandoned:
                await asyncio.sleep(self.heartbeat)
        if isinstance(written, Exception):  # the lease fails the row once the store is back
            self.log.extend([self.events.error_event(**store_failure(written, self.row.id))])
        elif not written and not self.deleted:
            held = await self._held()
            response = held if held is not None else response
        self.final = response
        self.log.extend([self.events.final_event(response)])
        self.log.close()

    async def _held(self) -> dict[str, Any] | None:
        """The finished response the store holds for this run (None: none, or it cannot be read)."""
        try:
            found = await self.store.get(self.row.id, self.row.owner)
        except Exception:
            logger.exception("background response %s: reading back its stored end failed", self.row.id)
            return None
        return public(found.response) if found and found.response["status"] not in UNFINISHED else None

    def _row(self, response: dict[str, Any]) -> StoredResponse:
        return StoredResponse(self.row.id, self.row.owner, response, self.row.input_items, self.row.previous_id)

    async def _write(self, response: dict[str, Any]) -> bool | Exception:
        """Whether the store took ``response`` (False: the row is finished, deleted or gone), or what it raised."""
        if self.deleted:
            return False
        try:
            return await self.store.update(self._row(response), runner=True)
        except Exception as exc:
            logger.error("background response %s: storing its %s status failed: %s", self.row.id, response["status"],
                         exc, exc_info=not isinstance(exc, APIError))  # fmt: skip
            return exc

    async def _beat(self) -> None:
        """Renew the lease every ``heartbeat`` seconds; stop the run once the store says another replica
        cancelled, failed or deleted it."""
        while True:
            await asyncio.sleep(self.heartbeat)
            try:
                status = await self.store.heartbeat(self.row.id)
            except Exception as exc:
                logger.error("background response %s: heartbeat failed: %s", self.row.id, exc,
                             exc_info=not isinstance(exc, APIError))  # fmt: skip
                continue
            if status is None or status not in UNFINISHED:
                self.deleted = status is None
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
    if response["status"] in UNFINISHED:  # running elsewhere: its status polled (no JSON), then its end read once
        while (status := await store.status(found.id, found.owner)) in UNFINISHED:
            await asyncio.sleep(POLL_SECONDS)
            await fail_stale(store, lease)
        again = await store.get(found.id, found.owner) if status is not None else None
        if again is None:  # deleted while running
            return
        response = again.response
    for event in replayed_events(response)[after + 1 :]:
        yield event
