"""The engine's LoRA adapters: wrapping the model once, loading and unloading adapters between steps.

Built when the server serves adapters (``--lora-modules`` or ``--lora-dir``): the model's projections
are wrapped before the runner is made (``model.lora.bank``), so every forward can carry adapters;
``load`` and ``unload`` run on the worker thread (between steps, through ``Worker.call``), so no
forward ever sees an adapter half written. An adapter that requests still use (running, waiting, or
submitted and not yet admitted) is not unloaded: ``unload`` refuses (``LoraInUse``, a 409) and the
operator retries once they finish; nothing in flight ever runs on another adapter's weights.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from decoding.kv.pool import KVPool
from decoding.model.lora import LoraBank, LoraResidency, LoraWeights, read_adapter
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
        logger.info("LoRA: %d projections wrapped, %d adapters resident at most, rank <= %d",
                    len(self.bank.linears), limits.max_loras, limits.max_lora_rank)  # fmt: skip

    @property
    def names(self) -> list[str]:
        return sorted(self.residency.known)

    def path_of(self, name: str) -> str:
        return self.residency.known[name].path

    def load(self, name: str, path: str, base_model_name: str | None = None) -> LoraWeights:
        """Read, check and register an adapter (``LoraRefused`` says why one cannot be served)."""
        if name in self.served_names:
            raise ValueError(f"a LoRA adapter cannot take the served model's name {name!r}")
        if name in self.residency.known:
            raise ValueError(f"a LoRA adapter named {name!r} is already loaded")
        weights = read_adapter(name, path, self.bank.targets, self.bank.max_rank, self.model_config,
                               base_model_name, self.served_names)  # fmt: skip
        self.residency.add(weights)
        logger.info("LoRA adapter %s loaded from %s (rank %d, scaling %g, %d modules)", name, path, weights.rank,
                    weights.scaling, len(weights.matrices))  # fmt: skip
        return weights

    def unload(self, name: str, requests: Iterable[GenerationParams], queued: int = 0) -> None:
        """Forget ``name``; refused while a request the engine holds (or ``queued`` more) uses it."""
        in_flight = sum(1 for params in requests if params.lora_name == name) + queued
        self.residency.remove(name, in_flight)
        logger.info("LoRA adapter %s unloaded", name)


def check_adapter(loras: EngineLoras | None, params: GenerationParams) -> None:
    """A request naming an adapter the engine does not hold (unloaded since the server checked) fails."""
    if params.lora_name is None:
        return
    if loras is None or params.lora_name not in loras.residency.known:
        raise ValueError(f"LoRA adapter {params.lora_name!r} is not loaded")
