"""The thread that owns the model: it alone runs forwards, so the event loop never waits on one.

Commands (new requests, aborts) arrive through a thread-safe inbox; outputs leave through each
request's sink callback. The loop sleeps on the inbox when there is nothing to do, and also when a
step changed nothing (every request waits for room that only a command or a time limit can make):
it never spins a core on work that cannot move.

Whenever the loop ends (``stop`` after the drain deadline, or a crash), every request it knows of
(running, waiting, or still a command in the inbox) and every submit that races with the end
gets a last output with ``error_code="unavailable"``: its client sees a 503 it may retry
elsewhere, never a stream that hangs or a 200 without a finish reason.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import torch

from decoding.model.seq2seq import EncoderInput
from decoding.outputs import RequestOutput
from decoding.params import GenerationParams
from decoding.vision.prompt import ImagePrompt

if TYPE_CHECKING:  # the worker steps any engine-shaped object; importing it would load the whole engine
    from decoding.engine.core import Engine

logger = logging.getLogger(__name__)

Sink = Callable[[RequestOutput], None]
Extra = TypeVar("Extra")

UNAVAILABLE = "unavailable"  # RequestOutput.error_code: the server stopped; the HTTP layer answers 503
STOPPED = "the server stopped before this request finished; retry it"
CRASHED = "the engine worker stopped unexpectedly; retry the request"
IDLE_RECHECK_S = 1.0  # the longest a worker whose work cannot move sleeps before stepping again


@dataclass
class _Submit:
    request_id: str
    prompt_ids: list[int]
    params: GenerationParams
    sink: Sink
    encoder_input: EncoderInput | None = None  # an encoder-decoder request's (Whisper's features)
    image_prompt: ImagePrompt | None = None  # a vision-language model's request: its prompt's images


@dataclass
class _Abort:
    request_id: str


class _Stop:
    pass


@dataclass
class _Call:
    """Work on the engine between two steps (loading a LoRA adapter): nothing else touches it meanwhile."""

    work: Callable[[Engine], object]
    done: Future


class Worker:
    def __init__(self, engine: Engine) -> None:
        """Made by ``spawn`` on the thread that built ``engine`` and will step it."""
        self.engine = engine
        engine.emit = self._dispatch
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        # commands taken from the inbox in the middle of a step (the urgent lane's), handled after it
        self._deferred: collections.deque = collections.deque()
        lane = getattr(engine, "urgent", None)
        if lane is not None:
            lane.take_commands = self._take_submits
        self._sinks: dict[str, Sink] = {}
        self._thread = threading.current_thread()
        self._stopped = threading.Event()
        self._end_message = STOPPED  # what the requests left at the end are told
        self._ending: str | None = None  # set while the loop fails what it leaves behind

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
    def submit(self, request_id: str, prompt_ids: list[int], params: GenerationParams, sink: Sink,
               encoder_input: EncoderInput | None = None, image_prompt: ImagePrompt | None = None) -> None:  # fmt: skip
        """Queue a request; if the loop has already ended, ``sink`` gets its "unavailable" output at once.

        The loop marks itself stopped before it empties the inbox for the last time, so a command
        put after that is seen here, and one put before is seen there: none is left behind.
        """
        self._inbox.put(_Submit(request_id, prompt_ids, params, sink, encoder_input, image_prompt))
        if self._stopped.is_set():
            self._fail_inbox(self._end_message)
            return
        lane = getattr(self.engine, "urgent", None)
        if lane is not None:  # a request that outranks the step under way stops it (engine/urgent.py)
            lane.offer(params.priority)

    def abort(self, request_id: str) -> None:
        self._inbox.put(_Abort(request_id))
        custom = getattr(self.engine, "custom", None)  # a custom_generate job holds this thread: flag it now
        if custom is not None:
            custom.cancel(request_id)

    def call(self, work: Callable[[Engine], object]) -> Future:
        """Run ``work(engine)`` on the worker thread between two steps; its result (or exception) in the future."""
        done: Future = Future()
        self._inbox.put(_Call(work, done))
        if self._stopped.is_set():
            self._fail_inbox(self._end_message)
        return done

    def stop(self, timeout: float | None = None) -> None:
        """End the loop after the current step; whatever is still running or queued then fails as
        "unavailable" (the drain deadline passed: the client may retry elsewhere)."""
        self._inbox.put(_Stop())
        custom = getattr(self.engine, "custom", None)  # a running custom_generate job ends now too
        if custom is not None:
            custom.stop()
        self._thread.join(timeout)

    @property
    def num_pending(self) -> int:
        """Requests submitted but not yet admitted to the batch (inbox plus waiting queue)."""
        custom = getattr(self.engine, "custom", None)  # queued custom_generate jobs wait too
        return self._inbox.qsize() + self.engine.scheduler.num_waiting + (len(custom.queue) if custom else 0)

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
        if sink is None:
            return
        if self._ending is None:
            sink(output)
        elif output.finished:  # whatever the engine says while the loop ends: the server stopped
            self._tell(sink, dataclasses.replace(output, error=output.error or self._ending, error_code=UNAVAILABLE))

    def _handle(self, command: object) -> bool:
        if isinstance(command, _Submit):
            self._sinks[command.request_id] = command.sink
            try:
                extra = {} if command.encoder_input is None else {"encoder_input": command.encoder_input}
                if command.image_prompt is not None:
                    extra["image_prompt"] = command.image_prompt
                self.engine.add_request(command.request_id, command.prompt_ids, command.params, **extra)
            except Exception as exc:  # bad request state must not kill the worker
                logger.exception("could not add request %s", command.request_id)
                self._dispatch(
                    RequestOutput(command.request_id, finished=True, error=f"request {command.request_id}: {exc}")
                )
        elif isinstance(command, _Abort):
            self.engine.abort(command.request_id)
        elif isinstance(command, _Call):
            try:
                command.done.set_result(command.work(self.engine))
            except Exception as exc:  # the caller's to answer (a refused adapter is a 400, not a dead worker)
                command.done.set_exception(exc)
        elif isinstance(command, _Stop):
            return False
        return True

    def _run(self) -> None:
        try:
            with torch.inference_mode():
                running, idle = True, False
                while running:
                    while running and self._deferred:  # what the urgent lane left for after the step, in order
                        running = self._handle(self._deferred.popleft())
                    if not running:
                        break
                    block = idle or not self.engine.has_work()
                    try:
                        command = self._inbox.get(block=block, timeout=self._sleep_limit() if block else None)
                        running = self._handle(command)
                        while running:
                            running = self._handle(self._inbox.get_nowait())
                    except queue.Empty:
                        pass
                    idle = False
                    if running and self.engine.has_work():
                        try:
                            idle = self.engine.step() is False
                        except Exception as exc:  # an engine bug: fail what is in flight, keep serving
                            logger.exception("engine step failed")
                            self.engine.fail_all(f"engine step failed: {exc}")
        except BaseException:
            self._end_message = CRASHED
            logger.exception("worker loop crashed")
        finally:
            self._stopped.set()
            self._fail_everything(self._end_message)

    def _take_submits(self) -> None:
        """The urgent lane's call, in the middle of a step: the inbox's new requests join the engine now;
        every other command waits for the step's end, in its order (an abort must not free rows the
        interrupted forward still feeds)."""
        while True:
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Submit):
                self._handle(command)
            else:
                self._deferred.append(command)

    def _sleep_limit(self) -> float | None:
        """How long the loop may wait for a command: forever with no work; with work that cannot move (a
        step that changed nothing), until the next request's time limit, and at most ``IDLE_RECHECK_S``
        (a backstop: were a step wrongly judged idle, its requests would stall a moment, never hang)."""
        if not self.engine.has_work():
            return None
        next_deadline = getattr(self.engine.scheduler, "next_deadline", None)
        deadline = next_deadline() if next_deadline is not None else None
        if deadline is None:
            return IDLE_RECHECK_S
        return min(max(0.0, deadline - time.monotonic()), IDLE_RECHECK_S)

    # ---- the end of the loop -----------------------------------------------------------------------
    def _fail_everything(self, message: str) -> None:
        """Finish every request the loop leaves behind with an "unavailable" error."""
        self._ending = message
        try:
            self.engine.fail_all(message, code=UNAVAILABLE)
        except Exception:  # a crashed engine may not manage it; its sinks are told below
            logger.exception("engine.fail_all failed while the worker stopped")
        for request_id, sink in list(self._sinks.items()):
            self._tell(sink, RequestOutput(request_id, finished=True, error=message, error_code=UNAVAILABLE))
        self._sinks.clear()
        self._fail_inbox(message)

    def _fail_inbox(self, message: str) -> None:
        """Answer the submits still in the inbox (safe from any thread: each command is taken once), and the
        calls the urgent lane had deferred."""
        while True:
            try:
                command = self._deferred.popleft()
            except IndexError:
                try:
                    command = self._inbox.get_nowait()
                except queue.Empty:
                    return
            if isinstance(command, _Submit):
                output = RequestOutput(command.request_id, finished=True, error=message, error_code=UNAVAILABLE)
                self._tell(command.sink, output)
            elif isinstance(command, _Call) and not command.done.done():
                command.done.set_exception(RuntimeError(message))

    @staticmethod
    def _tell(sink: Sink, output: RequestOutput) -> None:
        try:
            sink(output)
        except Exception:  # e.g. the event loop is already closed: nobody is waiting any more
            logger.debug("could not deliver the last output of %s", output.request_id, exc_info=True)
