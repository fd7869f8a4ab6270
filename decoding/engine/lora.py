"""The engine's LoRA adapters: wrapping the model once, reading adapters off the engine thread,
swapping them in and out between steps.

Built when the server serves adapters (``--lora-modules`` or runtime loading): the model's projections
are wrapped before the runner is made (``model.lora.bank``), so every forward can carry adapters.
Reading an adapter (its files, PEFT's config, the float32 conversion) is ``read``, which any thread
may run (the client runs it on a thread of its own, so generation never pauses for a disk); only
``add`` and ``unload`` run on the worker thread (between steps, through ``Worker.call``), so no
forward ever sees an adapter half written. A folder already loaded, unchanged (same resolved path,
same files' times and sizes), is not read again: the new name shares its matrices, so loading one
folder under several names keeps one float32 copy. An adapter that requests still use (running,
waiting, or submitted and not yet admitted) is not unloaded: ``unload`` refuses (``LoraInUse``, a
409) and the operator retries once they finish; nothing in flight ever runs on another adapter's
weights.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace

import torch

from decoding.kv.pool import KVPool
from decoding.model.lora import LoraBank, LoraResidency, LoraWeights, read_adapter
from decoding.model.lora.adapter import adapter_source, check_base_model_name
from decoding.params import GenerationParams

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoraLimits:
    max_loras: int = 4  # adapters resident at once (more are loaded, and swapped in LRU)
    max_lora_rank: int = 16


class EngineLoras:
    def __init__(self, model: torch.nn.Module, pool: KVPool, limits: LoraLimits, served_names: tuple[str, ...] = ()):
        self.bank = LoraBank(model, limits.max_loras, limits.max_lora_rank)
        self.residency = LoraResidency(self.bank, pool.num_slots)
        self.model_config = model.config
        self.served_names = served_names
        self._lock = threading.Lock()  # guards _by_source: read on the client's threads, changed on the worker's
        self._by_source: dict[tuple, LoraWeights] = {}  # a loaded folder's weights by adapter_source
        logger.info("LoRA: %d projections wrapped, %d adapters resident at most, rank <= %d",
                    len(self.bank.linears), limits.max_loras, limits.max_lora_rank)  # fmt: skip

    @property
    def names(self) -> list[str]:
        return sorted(self.residency.known)

    def path_of(self, name: str) -> str:
        return self.residency.known[name].path

    def load(self, name: str, path: str, base_model_name: str | None = None) -> LoraWeights:
        """Read, check and register an adapter at once (start-up's ``--lora-modules``, on the worker's thread
        before it serves); ``LoraRefused`` says why one cannot be served."""
        weights = self.read(name, path, base_model_name)
        self.add(weights)
        return weights

    def read(self, name: str, path: str, base_model_name: str | None = None) -> LoraWeights:
        """The adapter at ``path`` read and checked, not yet served: safe on any thread (it reads only what
        never changes after start, and the shared folders under a lock)."""
        if name in self.served_names:
            raise ValueError(f"a LoRA adapter cannot take the served model's name {name!r}")
        try:
            source = adapter_source(path)
        except OSError:  # a missing file: read_adapter names which
            source = None
        with self._lock:
            loaded = self._by_source.get(source) if source is not None else None
        if loaded is not None:
            check_base_model_name(name, base_model_name, self.served_names)
            return replace(loaded, name=name, base_model_name=base_model_name)
        return read_adapter(name, path, self.bank.targets, self.bank.max_rank, self.model_config, base_model_name,
                            self.served_names)  # fmt: skip

    def add(self, weights: LoraWeights, evict: str | None = None, requests: Iterable[GenerationParams] = ()) -> None:
        """Serve ``weights`` (read by ``read``), first unloading ``evict`` (the client's least recently used
        idle adapter, when ``--max-loaded-loras`` is reached; refused if ``requests`` still use it). On the
        worker thread, between steps."""
        if weights.name in self.served_names:
            raise ValueError(f"a LoRA adapter cannot take the served model's name {weights.name!r}")
        if weights.name in self.residency.known:
            raise ValueError(f"a LoRA adapter named {weights.name!r} is already loaded")
        if evict is not None:
            self.unload(evict, requests)
        with self._lock:
            shared = self._by_source.setdefault(weights.source, weights) if weights.source else weights
        if shared.matrices is not weights.matrices:  # the folder was read twice at once: keep one copy
            weights = replace(weights, matrices=shared.matrices)
        self.residency.add(weights)
        logger.info("LoRA adapter %s loaded from %s (rank %d, scaling %g, %d modules%s)", weights.name, weights.path,
                    weights.rank, weights.scaling, len(weights.matrices),
                    "" if shared is weights else f", sharing {shared.name}'s weights")  # fmt: skip

    def unload(self, name: str, requests: Iterable[GenerationParams], queued: int = 0) -> None:
        """Forget ``name``; refused while a request the engine holds (or ``queued`` more) uses it."""
        in_flight = sum(1 for params in requests if params.lora_name == name) + queued
        gone = self.residency.known.get(name)
        self.residency.remove(name, in_flight)
        if gone is not None:
            with self._lock:
                others = [weights for weights in self.residency.known.values() if weights.source == gone.source]
                if others:
                    self._by_source[gone.source] = others[0]
                else:
                    self._by_source.pop(gone.source, None)
        logger.info("LoRA adapter %s unloaded", name)


def check_adapter(loras: EngineLoras | None, params: GenerationParams) -> None:
    """A request naming an adapter the engine does not hold (unloaded since the server checked) fails."""
    if params.lora_name is None:
        return
    if loras is None or params.lora_name not in loras.residency.known:
        raise ValueError(f"LoRA adapter {params.lora_name!r} is not loaded")
