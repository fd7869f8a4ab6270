"""A fixed pool of KV slots: every row of every request owns one slot for its whole life.

Each layer holds one key and one value tensor ``[num_slots, num_kv_heads, max_model_len, head_dim]``
allocated once at start. A row writes its new K/V at its own positions (``index_put_``), so rows
of different lengths share one forward without padding the batch or concatenating caches, and
rolling back rejected tokens (speculative decoding) is only a length change. The pool does not
track lengths itself: a row's length is owned by its request state and passed in each step.
"""

from __future__ import annotations

import torch


class NoFreeSlotError(RuntimeError):
    """The scheduler asked for more slots than are free (a scheduler bug, never user input)."""


class KVPool:
    def __init__(
        self,
        *,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        max_model_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = (num_slots, num_kv_heads, max_model_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_slots = num_slots
        self.max_model_len = max_model_len
        # Lowest free slot first keeps the used slots packed at the front, so the decode
        # attention can run over a view of the leading slots without gathering.
        self._free = list(range(num_slots))

    @classmethod
    def for_model(
        cls, model: torch.nn.Module, *, num_slots: int, max_model_len: int, device: torch.device | str
    ) -> KVPool:
        """A pool shaped for ``model``'s layers and K/V heads, in its dtype."""
        config = model.config.get_text_config()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            num_layers=config.num_hidden_layers,
            num_slots=num_slots,
            num_kv_heads=config.num_key_value_heads,
            head_dim=head_dim,
            max_model_len=max_model_len,
            dtype=next(model.parameters()).dtype,
            device=device,
        )

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_slots

    def allocate(self) -> int:
        if not self._free:
            raise NoFreeSlotError("no free KV slot")
        self._free.sort()
        return self._free.pop(0)

    def free(self, slot: int) -> None:
        if slot in self._free:
            raise ValueError(f"KV slot {slot} freed twice")
        self._free.append(slot)

    def copy_prefix(self, src_slot: int, dst_slot: int, length: int) -> None:
        """Share a prompt between rows of one request (n > 1, beams) by copying its K/V once."""
        for layer_keys, layer_values in zip(self.keys, self.values, strict=True):
            layer_keys[dst_slot, :, :length].copy_(layer_keys[src_slot, :, :length])
            layer_values[dst_slot, :, :length].copy_(layer_values[src_slot, :, :length])

    def move_position(self, slot: int, src: int, dst: int) -> None:
        """Keep one token's K/V: a chosen contrastive candidate moves from scratch to its place."""
        for layer_keys, layer_values in zip(self.keys, self.values, strict=True):
            layer_keys[slot, :, dst].copy_(layer_keys[slot, :, src])
            layer_values[slot, :, dst].copy_(layer_values[slot, :, src])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)
