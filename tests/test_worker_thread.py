"""The worker thread builds the engine it steps, and a failed build reaches the caller."""

from __future__ import annotations

import threading

import pytest

from decoding.engine.worker import Worker


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
