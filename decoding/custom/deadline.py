"""A custom method's deadline, enforced from outside the worker thread it runs on.

A custom ``generate()`` is user code on the worker thread: its stopping criteria and the forward
pre-hooks stop it only if it checks them or calls the model. One that loops without either held
the worker (every other request) forever while ``/health`` stayed green. The watchdog here is a
timer thread per job: ``grace`` seconds past the deadline it raises ``DeadlineExceeded`` inside the
worker thread (``PyThreadState_SetAsyncExc``: delivered at the next Python bytecode the job runs,
so the ``with`` blocks around it unwind and give back the attention mode, the RNG and the hooks);
if the job is still running ``stuck_after`` seconds later (inside one C call that never returns),
``stuck`` names it, and ``/health`` answers 503 with that reason so an orchestrator restarts the
replica.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class DeadlineExceeded(BaseException):
    """Raised inside a custom method that ran past its deadline without stopping; a BaseException,
    like KeyboardInterrupt, so the method's own ``except Exception`` does not swallow it."""


def _raise_in(thread_id: int, exception: type[BaseException] | None) -> None:
    """Schedule ``exception`` in the thread (``None`` clears a pending one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exception) if exception
                                               else ctypes.c_void_p(0))  # fmt: skip


class Watchdog:
    """Watches one job at a time (jobs run one at a time on the worker thread)."""

    def __init__(self, grace: float = 1.0, stuck_after: float = 5.0) -> None:
        self.grace = grace
        self.stuck_after = stuck_after
        self.stuck: str | None = None  # read by /health from the event loop
        self._lock = threading.Lock()
        self._active = False
        self._fired = False

    @contextmanager
    def watch(self, label: str, deadline: float) -> Iterator[None]:
        """Run the body under ``deadline`` (``time.monotonic``); ``label`` names the job in ``stuck``."""
        thread_id = threading.get_ident()
        done = threading.Event()
        with self._lock:
            self._active, self._fired = True, False

        def enforce() -> None:
            if done.wait(max(0.0, deadline - time.monotonic()) + self.grace):
                return
            give_up = time.monotonic() + self.stuck_after
            while time.monotonic() < give_up:  # again and again: the method may catch it
                with self._lock:
                    if not self._active:
                        return
                    self._fired = True
                    _raise_in(thread_id, DeadlineExceeded)
                if done.wait(0.5):
                    return
            with self._lock:
                if self._active:
                    self.stuck = (f"{label} has run {self.grace + self.stuck_after:.0f} s past its deadline and "
                                  "does not stop; the worker is blocked: restart the replica")  # fmt: skip

        timer = threading.Thread(target=enforce, name="decoda-custom-deadline", daemon=True)
        timer.start()
        try:
            yield
        finally:
            while True:  # the exception may land even here, before it is cleared: then finish again
                try:
                    self._finish(thread_id, done)
                    break
                except DeadlineExceeded:
                    continue

    def _finish(self, thread_id: int, done: threading.Event) -> None:
        with self._lock:
            self._active = False
            if self._fired:  # scheduled but not yet delivered: it must not land in the engine's code
                _raise_in(thread_id, None)
            self.stuck = None
        done.set()
