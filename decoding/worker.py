"""The thread that owns the model: it alone runs forwards, so the event loop never waits on one.

Commands (new requests, aborts) arrive through a thread-safe inbox; outputs leave through each
request's sink callback. The loop sleeps on the inbox when there is nothing to do.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from decoding.engine import Engine
from decoding.outputs import RequestOutput
from decoding.params import GenerationParams

logger = logging.getLogger(__name__)

Sink = Callable[[RequestOutput], None]
Extra = TypeVar("Extra")


@dataclass
class _Submit:
    request_id: str
    prompt_ids: list[int]
    params: GenerationParams
    sink: Sink


@dataclass
class _Abort:
    request_id: str


class _Stop:
    pass


class Worker:
    def __init__(self, engine: Engine) -> None:
        """Made by ``spawn`` on the thread that built ``engine`` and will step it."""
        self.engine = engine
        engine.emit = self._dispatch
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}
        self._thread = threading.current_thread()
        self._stopped = threading.Event()

    @classmethod
    def spawn(cls, build: Callable[[], tuple[Engine, Extra]]) -> tuple[Worker, Extra]:
        """Start the worker thread, build the engine ON it, and return once it is built.

        Building on the thread that steps the engine keeps every PyTorch op of the process on one
        OpenMP team (see ``decoding/launch.py``). An exception from ``build`` is re-raised here.
        """
        built: dict[str, object] = {}
        ready = threading.Event()

        def build_then_run() -> None:
            try:
                engine, extra = build()
                worker = cls(engine)
                built.update(worker=worker, extra=extra)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                built["error"] = exc
                return
            finally:
                ready.set()
            worker._run()

        threading.Thread(target=build_then_run, name="decoda-worker", daemon=True).start()
        ready.wait()
        if "error" in built:
            raise built["error"]
        return built["worker"], built["extra"]

    # ---- called from any thread ----------------------------------------------------------------
    def submit(self, request_id: str, prompt_ids: list[int], params: GenerationParams, sink: Sink) -> None:
        self._inbox.put(_Submit(request_id, prompt_ids, params, sink))

    def abort(self, request_id: str) -> None:
        self._inbox.put(_Abort(request_id))

    def stop(self, timeout: float | None = None) -> None:
        self._inbox.put(_Stop())
        self._thread.join(timeout)

    @property
    def num_pending(self) -> int:
        """Requests submitted but not yet admitted to the batch (inbox plus waiting queue)."""
        return self._inbox.qsize() + self.engine.scheduler.num_waiting

    @property
    def num_active(self) -> int:
        return self._inbox.qsize() + len(self.engine.requests)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopped.is_set()

    # ---- the worker thread -----------------------------------------------------------------------
    def _dispatch(self, output: RequestOutput) -> None:
        sink = self._sinks.get(output.request_id)
        if output.finished:
            self._sinks.pop(output.request_id, None)
        if sink is not None:
            sink(output)

    def _handle(self, command: object) -> bool:
        if isinstance(command, _Submit):
            self._sinks[command.request_id] = command.sink
            try:
                self.engine.add_request(command.request_id, command.prompt_ids, command.params)
            except Exception as exc:  # bad request state must not kill the worker
                logger.exception("could not add request %s", command.request_id)
                self._dispatch(
                    RequestOutput(command.request_id, finished=True, error=f"request {command.request_id}: {exc}")
                )
        elif isinstance(command, _Abort):
            self.engine.abort(command.request_id)
        elif isinstance(command, _Stop):
            return False
        return True

    def _run(self) -> None:
        try:
            with torch.inference_mode():
                running = True
                while running:
                    block = not self.engine.has_work()
                    try:
                        command = self._inbox.get(block=block)
                        running = self._handle(command)
                        while running:
                            running = self._handle(self._inbox.get_nowait())
                    except queue.Empty:
                        pass
                    if running and self.engine.has_work():
                        try:
                            self.engine.step()
                        except Exception as exc:  # an engine bug: fail what is in flight, keep serving
                            logger.exception("engine step failed")
                            self.engine.fail_all(f"engine step failed: {exc}")
        except Exception:
            logger.exception("worker loop crashed")
        finally:
            self._stopped.set()
            for request_id in list(self.engine.requests):
                self.engine.abort(request_id)
