"""The worker thread builds the engine it steps, and a failed build reaches the caller."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from decoding.engine.worker import IDLE_RECHECK_S, Worker


class _IdleEngine:
    """Enough of an Engine for the worker loop: never has work."""

    def __init__(self) -> None:
        self.built_on = threading.current_thread()
        self.requests: dict = {}
        self.scheduler = type("S", (), {"num_waiting": 0})()
        self.emit = None

    def has_work(self) -> bool:
        return False

    def abort(self, request_id: str) -> None:
        pass


def test_spawn_builds_on_the_thread_that_steps():
    worker, extra = Worker.spawn(lambda: (_IdleEngine(), "facts"))
    try:
        assert extra == "facts" and worker.alive
        assert worker.engine.built_on is worker._thread and worker.engine.built_on.name == "decoda-worker"
        assert worker.engine.built_on is not threading.current_thread()
    finally:
        worker.stop(5)
    assert not worker.alive


def test_spawn_reraises_a_failed_build():
    def broken() -> tuple:
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        Worker.spawn(broken)


class _StuckEngine(_IdleEngine):
    """Has work, but every step changes nothing (every request waits for room nobody frees)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0

    def has_work(self) -> bool:
        return True

    def step(self) -> bool:
        self.steps += 1
        return False

    def fail_all(self, message: str, code: str = "internal") -> None:
        pass


class _RecordingInbox:
    """The worker's inbox, recording how it is read: a blocking read stops the loop."""

    def __init__(self) -> None:
        self.polls = 0
        self.blocking_reads: list[float | None] = []
        self.stopped = False

    def get(self, block: bool = True, timeout: float | None = None) -> object:
        from decoding.engine.worker import _Stop

        if self.stopped:
            raise queue.Empty
        if block:
            self.blocking_reads.append(timeout)
        else:
            self.polls += 1
        if block or self.polls > 50:  # (a spinning loop is ended too, so the test fails instead of hanging)
            self.stopped = True
            return _Stop()
        raise queue.Empty

    def get_nowait(self) -> object:
        return self.get(block=False)


def test_a_step_that_changes_nothing_makes_the_worker_wait_instead_of_spinning():
    engine = _StuckEngine()
    worker = Worker(engine)
    worker._inbox = _RecordingInbox()
    worker._run()
    assert engine.steps == 1  # one step that changed nothing, then a blocking wait for a command
    assert worker._inbox.blocking_reads == [IDLE_RECHECK_S]  # no time limit: a command, or the backstop


def test_a_stuck_worker_wakes_for_the_next_time_limit():
    engine = _StuckEngine()
    engine.scheduler.next_deadline = lambda: time.monotonic() + 0.5  # a request's --request-timeout ends it then
    worker = Worker(engine)
    worker._inbox = _RecordingInbox()
    worker._run()
    assert engine.steps == 1 and len(worker._inbox.blocking_reads) == 1
    assert 0 < worker._inbox.blocking_reads[0] <= 0.5
