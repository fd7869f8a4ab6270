"""The client's side of the LoRA adapters: which names are served, which requests use them, and the
``--max-loaded-loras`` cap with least-recently-used eviction of idle adapters.

Every loaded adapter keeps its float32 matrices in host memory, so adapters loaded at runtime are
capped: loading one more than ``--max-loaded-loras`` unloads the least recently used (by requests
started on it, or its loading) that has no request in flight, and when every one has requests in
flight the load is refused (``LoraLimitError``, a 429 naming the cap) rather than waiting or
switching a running request to other weights. Adapters of ``--lora-modules`` (loaded at start) are
pinned: not counted, never unloaded to make room.

A load runs in three parts (``LoadsLoras.load_lora_adapter``, the client's): ``reserve`` the name, read the
folder on a thread of its own (never the engine's), then ``make_room`` (choosing the adapter to
evict, which stops new requests naming it at once) and swap both on the worker between two steps;
``loaded`` or ``abandon`` ends it. The event loop's thread makes every call; a lock keeps the
bookkeeping whole all the same.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from decoding.client_api import LoraBusyError, LoraLimitError, ServedModel
from decoding.engine.worker import Worker
from decoding.params import ParameterError

logger = logging.getLogger(__name__)

Evicted = tuple[str, ServedModel]


class LoraCatalog:
    def __init__(self, pinned: dict[str, ServedModel], max_loaded: int) -> None:
        """``pinned``: the adapters loaded at start; ``max_loaded``: ``--max-loaded-loras``."""
        self._entries: OrderedDict[str, ServedModel] = OrderedDict(pinned)  # least recently used first
        self._pinned = frozenset(pinned)
        self.max_loaded = max_loaded
        self._of: dict[str, str] = {}  # request id in flight -> its adapter
        self._reserved: set[str] = set()  # names being loaded
        self._counted: set[str] = set()  # of those, the ones room was made for (they count against the cap)
        self._lock = threading.Lock()

    # ---- listing and requests ---------------------------------------------------------------------------
    def names(self) -> list[str]:
        return list(self._entries)

    def entries(self) -> list[ServedModel]:
        return list(self._entries.values())

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def begin(self, request_id: str, name: str) -> None:
        """A request starts on ``name`` (it is then in flight, and the adapter the most recently used)."""
        with self._lock:
            if name not in self._entries:  # unloaded (or evicted) since the route looked
                raise ParameterError(f"The model '{name}' does not exist", param="model", code="model_not_found")
            self._of[request_id] = name
            self._entries.move_to_end(name)

    def end(self, request_id: str) -> None:
        with self._lock:
            self._of.pop(request_id, None)

    def in_flight(self, name: str) -> int:
        return sum(1 for adapter in self._of.values() if adapter == name)

    # ---- loading --------------------------------------------------------------------------------------
    def reserve(self, name: str, taken: bool) -> None:
        """Hold ``name`` for a load; refused when it is served (``taken``: by the model or an assistant), being
        loaded, or when the cap is reached with no idle adapter to make room (refused before any reading)."""
        with self._lock:
            if taken or name in self._entries or name in self._reserved:
                raise ParameterError(f"the name '{name}' is already served; unload it first or choose another",
                                     param="lora_name", code="lora_name_taken")  # fmt: skip
            if self._loaded_count() >= self.max_loaded and self._idle() is None:
                raise self._full()
            self._reserved.add(name)

    def make_room(self, name: str) -> Evicted | None:
        """Before ``name`` (reserved, read) is swapped in: the adapter to unload for it, taken off the list now
        (no new request starts on it), or None when the cap leaves room; ``LoraLimitError`` when it does not
        and every adapter has requests in flight (the reservation is then dropped)."""
        with self._lock:
            evicted = None
            if self._loaded_count() >= self.max_loaded:
                victim = self._idle()
                if victim is None:
                    self._reserved.discard(name)
                    raise self._full()
                evicted = (victim, self._entries.pop(victim))
            self._counted.add(name)
            return evicted

    def loaded(self, name: str, entry: ServedModel) -> None:
        with self._lock:
            self._reserved.discard(name)
            self._counted.discard(name)
            self._entries[name] = entry  # the most recently used

    def abandon(self, name: str, evicted: Evicted | None = None) -> None:
        """The load failed: drop the reservation and list ``evicted`` again (still loaded: its unload did not run)."""
        with self._lock:
            self._reserved.discard(name)
            self._counted.discard(name)
            if evicted is not None:
                self._entries[evicted[0]] = evicted[1]
                self._entries.move_to_end(evicted[0], last=False)  # still the least recently used

    # ---- unloading ------------------------------------------------------------------------------------
    def take_off(self, name: str) -> ServedModel:
        """Stop listing ``name`` for an unload; ``LoraBusyError`` while requests use it (KeyError: unknown)."""
        with self._lock:  # no request can start on it between this check and its removal from the list
            entry = self._entries[name]
            in_flight = self.in_flight(name)
            if in_flight:
                raise LoraBusyError(f"the LoRA adapter '{name}' has {in_flight} request(s) in flight; unload it "
                                    "once they finish")  # fmt: skip
            del self._entries[name]
            return entry

    def put_back(self, name: str, entry: ServedModel) -> None:
        with self._lock:
            self._entries[name] = entry

    # ---- the cap ----------------------------------------------------------------------------------------
    def _loaded_count(self) -> int:
        return sum(1 for name in self._entries if name not in self._pinned) + len(self._counted)

    def _idle(self) -> str | None:
        """The least recently used adapter loaded at runtime with no request in flight."""
        busy = set(self._of.values())
        return next((name for name in self._entries if name not in self._pinned and name not in busy), None)

    def _full(self) -> LoraLimitError:
        return LoraLimitError(f"{self.max_loaded} LoRA adapters are loaded (--max-loaded-loras) and each has "
                              "requests in flight; retry once one is idle (it is then unloaded to make room), or "
                              "unload one")  # fmt: skip


class LoadsLoras:
    """``WorkerEngineClient``'s runtime load and unload (it holds ``worker``, ``_loras``, ``_served_name``,
    ``_assistants`` and ``_lora_entry``); before ``EngineClient`` in its bases, whose refusals ``super()`` reaches."""

    worker: Worker
    _loras: LoraCatalog
    _served_name: str
    _assistants: list[ServedModel]
    _lora_entry: Callable[[str, str], ServedModel]  # an adapter's /v1/models entry

    async def load_lora_adapter(self, name: str, path: str) -> None:
        """Read the folder on a thread of its own (generation goes on), then swap it in on the worker between
        two steps, with the least recently used idle adapter out when ``--max-loaded-loras`` is reached."""
        loras = getattr(self.worker.engine, "loras", None)
        if loras is None:
            await super().load_lora_adapter(name, path)  # type: ignore[misc]: EngineClient's refusal
        self._loras.reserve(name, taken=name == self._served_name or name in {a.name for a in self._assistants})
        try:
            weights = await asyncio.to_thread(loras.read, name, path)
        except (ValueError, OSError) as error:  # LoraRefused: the reason the adapter cannot be served as PEFT runs it
            self._loras.abandon(name)
            raise ParameterError(str(error), param="lora_path", code="lora_refused") from error
        except BaseException:
            self._loras.abandon(name)
            raise
        evicted = self._loras.make_room(name)

        def swap(engine: object) -> None:
            requests = [request.params for request in engine.requests.values()]  # type: ignore[attr-defined]
            engine.loras.add(weights, evicted[0] if evicted else None, requests)  # type: ignore[attr-defined]

        try:
            await asyncio.wrap_future(self.worker.call(swap))
        except BaseException:
            self._loras.abandon(name, evicted)
            raise
        if evicted:
            logger.info("LoRA adapter %s unloaded to make room for %s (--max-loaded-loras %d)", evicted[0], name,
                        self._loras.max_loaded)  # fmt: skip
        self._loras.loaded(name, self._lora_entry(name, weights.path))

    async def unload_lora_adapter(self, name: str) -> None:
        if name not in self._loras:
            await super().unload_lora_adapter(name)  # type: ignore[misc]: EngineClient's 404
        removed = self._loras.take_off(name)

        def unload(engine: object) -> None:
            requests = [request.params for request in engine.requests.values()]  # type: ignore[attr-defined]
            engine.loras.unload(name, requests)  # type: ignore[attr-defined]

        try:
            await asyncio.wrap_future(self.worker.call(unload))
        except Exception:  # LoraInUse (a LoraBusyError): a request the engine holds still uses it
            self._loras.put_back(name, removed)  # still loaded: list it again
            raise
