"""Which adapters the server knows, which ``--max-loras`` of them sit in the bank's slots, who uses them.

Every loaded adapter's matrices are kept in host memory (``LoraWeights``); at most ``--max-loras`` of
them are resident in the bank at once. A request takes its adapter's slot at admission
(``acquire``): an adapter already resident is shared, else it goes into a free slot, else into the
least recently used slot no running request holds (vLLM's LRU). When every slot is held by running
requests, the request waits in the queue until one is let go (``release``). Each KV row of a request
is bound to its adapter's slot (``bind``), which is how the runner gives every packed token its
adapter index whatever strategy planned the row (beams, candidates, drafts, guidance twins).

Each loaded adapter also gets an id of its own, never reused (``uid``): the prefix cache keys a
row's blocks under it (``kv.blocks.adapter_root``), so two adapters, or an adapter unloaded and
another loaded under its name, never share K/V for the same prompt.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict

from decoding.client_api import LoraBusyError
from decoding.model.lora.adapter import LoraWeights
from decoding.model.lora.bank import LoraBank


class LoraInUse(LoraBusyError):
    """An adapter with requests in flight cannot be unloaded (they would run on another's weights)."""


class LoraResidency:
    def __init__(self, bank: LoraBank, num_kv_slots: int) -> None:
        self.bank = bank
        self.known: dict[str, LoraWeights] = {}
        self.uids: dict[str, int] = {}
        self._next_uid = itertools.count(1)
        self.resident: list[str | None] = [None] * bank.num_slots  # slot 0 stays None: the zero adapter
        self.holders = [0] * bank.num_slots
        self._idle: OrderedDict[int, None] = OrderedDict()  # resident, held by nobody; least recent first
        self.kv_adapter = [0] * num_kv_slots  # KV row -> the bank slot of its request's adapter

    @property
    def max_loras(self) -> int:
        return self.bank.num_slots - 1

    # ---- loading ---------------------------------------------------------------------------------------
    def add(self, weights: LoraWeights) -> None:
        if weights.name in self.known:
            raise ValueError(f"a LoRA adapter named {weights.name!r} is already loaded")
        self.known[weights.name] = weights
        self.uids[weights.name] = next(self._next_uid)

    def remove(self, name: str, in_flight: int = 0) -> None:
        """Forget an adapter; refused (``LoraInUse``) while ``in_flight`` requests or a running one use it."""
        if name not in self.known:
            raise KeyError(name)
        slot = self._slot_of(name)
        if in_flight or (slot is not None and self.holders[slot]):
            raise LoraInUse(f"LoRA adapter {name!r} has {max(in_flight, 1)} request(s) in flight; unload it once "
                            "they finish")  # fmt: skip
        if slot is not None:
            self.resident[slot] = None
            self._idle.pop(slot, None)
            self.bank.write(slot, None)
        del self.known[name], self.uids[name]

    # ---- requests ------------------------------------------------------------------------------------
    def acquire(self, name: str) -> int | None:
        """The bank slot holding ``name`` for one more request, loading it if needed; None: no slot is
        free now (every one is held by running requests): the request waits."""
        if name not in self.known:
            raise KeyError(name)
        slot = self._slot_of(name)
        if slot is None:
            slot = self._free_slot()
            if slot is None:
                return None
            self.resident[slot] = name
            self.bank.write(slot, self.known[name])
        self._idle.pop(slot, None)
        self.holders[slot] += 1
        return slot

    def release(self, slot: int) -> None:
        if slot == 0:
            return
        self.holders[slot] -= 1
        if self.holders[slot] == 0:
            self._idle[slot] = None

    def bind(self, kv_slots: list[int], slot: int) -> None:
        for kv_slot in kv_slots:
            self.kv_adapter[kv_slot] = slot

    def running_names(self) -> list[str]:
        return sorted(name for slot, name in enumerate(self.resident) if name is not None and self.holders[slot])

    def _slot_of(self, name: str) -> int | None:
        for slot, resident in enumerate(self.resident):
            if slot and resident == name:
                return slot
        return None

    def _free_slot(self) -> int | None:
        for slot in range(1, self.bank.num_slots):
            if self.resident[slot] is None:
                return slot
        if self._idle:  # evict the least recently used adapter nobody runs
            slot, _ = self._idle.popitem(last=False)
            self.resident[slot] = None
            return slot
        return None
