"""The paged KV cache: one pool of fixed-size blocks, a block table per row, prefixes shared.

Each layer holds one key and one value tensor ``[num_blocks, num_kv_heads, block_size, head_dim]``
sized by memory at start. A row (a "slot": the handle a strategy holds for one sequence) owns a
block table, the list of blocks holding its positions ``0, block_size, 2*block_size, ...``; it
grows a block at a time as the row grows, so memory follows the tokens actually cached, not
``max_model_len``. Rows of one request, beams and requests with a common prompt hold the same
blocks (``kv_blocks.BlockAllocator`` counts the holders); a row about to write into a block
somebody else holds copies that one block first, so a beam step never copies a shared prefix.

The pool does not track lengths: a row's length is owned by its request state and passed in each
step (``prepare`` before a forward writes). Rolling back rejected drafts is a length change.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from decoding.kv.blocks import ROOT, BlockAllocator, OutOfBlocksError
from decoding.kv.media_rows import RowMedia, keyed

__all__ = ["KVPool", "NoFreeSlotError", "OutOfBlocksError", "SwappedRows"]

DEFAULT_BLOCK_SIZE = 16


class NoFreeSlotError(RuntimeError):
    """The scheduler asked for more row handles than exist (a scheduler bug, never user input)."""


@dataclass
class SwappedRows:
    """A preempted request's K/V held outside the pool until it resumes.

    Its rows share blocks (n > 1 rows share the prompt, beams their common past, a guidance twin
    nothing): each distinct block is copied once into ``keys`` and ``values`` (``[layers, blocks,
    ...]`` each: apart, because MLA families cache values narrower than keys) and ``tables`` maps
    each row to the copies it held, in order, so the host copy and the blocks it needs to resume are
    what the request held, not one prompt per row.
    """

    keys: torch.Tensor | None
    values: torch.Tensor | None
    tables: dict[int, list[int]]  # slot -> indices into the copies' block axis

    @property
    def num_blocks(self) -> int:
        return 0 if self.keys is None else self.keys.shape[1]

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return sum(copy.numel() * copy.element_size() for copy in (self.keys, self.values))


@dataclass
class _Registered:
    """How far a row's blocks are registered in the prefix cache, and the key the next one extends."""

    num_blocks: int = 0
    parent: int = ROOT


class KVPool:
    def __init__(
        self,
        *,
        num_layers: int,
        num_blocks: int,
        num_kv_heads: int,
        head_dim: int,
        max_model_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
        num_slots: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        prefix_caching: bool = True,
        value_head_dim: int | None = None,
    ) -> None:
        """``value_head_dim``: the values' head size where it differs from the keys' (MLA)."""
        # one block more than the allocator hands out: the scratch block, where the padding rows of a
        # replayed CUDA graph write and read (``decoding.model.cuda_graphs``); no row ever holds it
        shape = (num_blocks + 1, num_kv_heads, block_size, head_dim)
        value_shape = (num_blocks + 1, num_kv_heads, block_size, value_head_dim or head_dim)
        self.scratch_block = num_blocks
        # uninitialised: pages become resident as blocks are first written, and nothing reads a
        # position before its row wrote it (the gathering fallback zeroes what it masks)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.empty(value_shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.block_size = block_size
        self.max_model_len = max_model_len  # the longest row a caller may ask for (drafting checks it)
        self.blocks = BlockAllocator(num_blocks, prefix_caching=prefix_caching)
        self.num_slots = num_slots
        self.tables: list[list[int]] = [[] for _ in range(num_slots)]
        self._registered = [_Registered() for _ in range(num_slots)]
        self._roots = [ROOT] * num_slots  # each row's prefix-cache root: its LoRA adapter's (blocks.adapter_root)
        self.media: list[RowMedia | None] = [None] * num_slots  # a row whose prompt holds images (media_rows.py)
        self._free_slots = list(range(num_slots))
        self.num_copied_blocks = 0  # copy-on-write copies made (a test reads it: beams share prefixes)
        # an encoder-decoder model's pool: each row's cross slot (its request's encoder keys and values,
        # ``decoding.model.seq2seq``) and each cross slot's length; None for a decoder-only model
        self.cross_slots: dict[int, int] | None = None
        self.cross_lengths: dict[int, int] = {}

    @classmethod
    def for_model(
        cls,
        model: torch.nn.Module,
        *,
        num_slots: int,
        max_model_len: int,
        device: torch.device | str,
        num_blocks: int | None = None,
        memory_bytes: int | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        prefix_caching: bool = True,
    ) -> KVPool:
        """A pool shaped for ``model``'s layers and K/V heads, in its dtype: ``num_blocks`` blocks, or
        as many as ``memory_bytes`` hold, or by default enough for every row at full length."""
        config = model.config.get_text_config()
        dtype = next(model.parameters()).dtype
        if num_blocks is None:
            if memory_bytes is not None:
                per_block = bytes_per_block(config, block_size, dtype)
                num_blocks = memory_bytes // per_block
                if num_blocks < 1:
                    raise ValueError(f"--kv-cache-memory {memory_bytes} bytes is less than one block ({per_block})")
            else:
                num_blocks = num_slots * -(-max_model_len // block_size)
        num_kv_heads, key_dim, value_dim = kv_shape(config)
        pool = cls(
            num_layers=cached_layers(config),
            num_blocks=num_blocks,
            num_kv_heads=num_kv_heads,
            head_dim=key_dim,
            value_head_dim=value_dim,
            max_model_len=max_model_len,
            dtype=dtype,
            device=device,
            num_slots=num_slots,
            block_size=block_size,
            prefix_caching=prefix_caching,
        )
        if getattr(config, "is_encoder_decoder", False):
            pool.cross_slots = {}
        return pool

    # ---- counting ------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Free row handles (the scheduler also checks blocks: ``blocks.num_free``)."""
        return len(self._free_slots)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by running rows (cached blocks nobody holds count as free)."""
        return self.blocks.num_used / self.blocks.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def nbytes(self) -> int:
        """Bytes of the blocks rows may hold (the scratch block is not the cache's)."""
        whole = sum(t.numel() * t.element_size() for t in self.keys + self.values)
        return whole * self.blocks.num_blocks // (self.blocks.num_blocks + 1)

    def nbytes_held(self) -> int:
        """Bytes of the blocks running rows hold: what the cache's memory really follows."""
        return self.nbytes() * self.blocks.num_used // self.blocks.num_blocks

    # ---- row handles ---------------------------------------------------------------------------
    def allocate(self) -> int:
        if not self._free_slots:
            raise NoFreeSlotError("no free KV row")
        self._free_slots.sort()
        return self._free_slots.pop(0)

    def free(self, slot: int) -> None:
        if slot in self._free_slots:
            raise ValueError(f"KV row {slot} freed twice")
        self.truncate(slot, 0)
        self._roots[slot] = ROOT
        self.media[slot] = None
        self._registered[slot] = _Registered()
        self._free_slots.append(slot)

    def set_root(self, slot: int, root: int) -> None:
        """Key the row's prefix-cache blocks under ``root`` (its adapter's, ``blocks.adapter_root``)."""
        self._roots[slot] = root
        self._registered[slot] = _Registered(parent=root)

    def truncate(self, slot: int, num_tokens: int) -> None:
        """Let go of the row's blocks past its first ``num_tokens`` positions, the last first: cached blocks
        are evicted least recently released first, and a prefix is matched from its first block on, so
        a row's tail must go before its head (evicting the head first would orphan every block after it
        while they still took space)."""
        table = self.tables[slot]
        keep = self.blocks_for(num_tokens)
        for block in reversed(table[keep:]):
            self.blocks.release(block)
        del table[keep:]
        registered = self._registered[slot]
        if registered.num_blocks > keep:
            self._registered[slot] = _Registered(parent=self._roots[slot])

    # ---- writing ---------------------------------------------------------------------------------
    def blocks_needed(self, slot: int, start: int, end: int) -> int:
        """Blocks ``prepare(slot, start, end)`` would take: new ones, and copies of shared ones."""
        table = self.tables[slot]
        first, last = start // self.block_size, self.blocks_for(end)
        copies = sum(1 for block in table[first:last] if self.blocks.is_shared(block))
        return max(0, last - len(table)) + copies

    def prepare(self, slot: int, start: int, end: int) -> None:
        """Make positions ``start..end-1`` of the row writable: grow its table, and give it its own
        copy of any block there it shares (copy-on-write). Raises ``OutOfBlocksError``."""
        if end <= start:
            return
        table = self.tables[slot]
        first, last = start // self.block_size, self.blocks_for(end)
        for index in range(first, min(last, len(table))):
            block = table[index]
            if self.blocks.is_shared(block):
                copy = self.blocks.take()
                self._copy_block(block, copy)
                self.blocks.release(block)
                table[index] = copy
            else:
                self.blocks.before_write(block)
        while len(table) < last:
            table.append(self.blocks.take())
        registered = self._registered[slot]
        if registered.num_blocks > first:
            self._registered[slot] = _Registered(parent=self._roots[slot])

    def write(self, slot: int, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write ``keys``/``values`` (``[kv_heads, length, head_dim]``) at the row's positions ``0..length-1``
        of one layer (an encoder's keys and values in a cross slot); ``prepare`` made them writable."""
        length = keys.shape[1]
        positions = torch.arange(length, device=self.keys[layer].device)
        table = torch.tensor(self.tables[slot], dtype=torch.long, device=positions.device)
        blocks, offsets = table[positions // self.block_size], positions % self.block_size
        self.keys[layer][blocks, :, offsets] = keys.transpose(0, 1).to(self.keys[layer].dtype)
        self.values[layer][blocks, :, offsets] = values.transpose(0, 1).to(self.values[layer].dtype)

    def _copy_block(self, src: int, dst: int) -> None:
        for layer_keys, layer_values in zip(self.keys, self.values, strict=True):
            layer_keys[dst].copy_(layer_keys[src])
            layer_values[dst].copy_(layer_values[src])
        self.num_copied_blocks += 1

    def copy_prefix(self, src_slot: int, dst_slot: int, length: int) -> None:
        """Give ``dst_slot`` the first ``length`` positions of ``src_slot`` by sharing its blocks
        (n > 1 rows, beams); the first write into a shared block copies that block only."""
        self.truncate(dst_slot, 0)
        shared = self.tables[src_slot][: self.blocks_for(length)]
        for block in shared:
            self.blocks.share(block)
        self.tables[dst_slot] = list(shared)

    def move_position(self, slot: int, src: int, dst: int) -> None:
        """Keep one token's K/V: a chosen contrastive candidate moves from scratch to its place."""
        self.prepare(slot, dst, dst + 1)
        table, size = self.tables[slot], self.block_size
        src_block, src_offset = table[src // size], src % size
        dst_block, dst_offset = table[dst // size], dst % size
        for layer_keys, layer_values in zip(self.keys, self.values, strict=True):
            layer_keys[dst_block, :, dst_offset].copy_(layer_keys[src_block, :, src_offset])
            layer_values[dst_block, :, dst_offset].copy_(layer_values[src_block, :, src_offset])

    # ---- the prefix cache ------------------------------------------------------------------------
    def attach_prefix(self, slot: int, token_ids: list[int], max_tokens: int) -> int:
        """Start an empty row from cached blocks holding a prefix of ``token_ids`` (at most
        ``max_tokens``); returns how many tokens it got for free."""
        blocks = self.blocks.match(keyed(token_ids, self.media[slot]), self.block_size, max_tokens, self._roots[slot])
        for block in blocks:
            self.blocks.share(block)
        self.tables[slot] = list(blocks)
        return len(blocks) * self.block_size

    def register(self, slot: int, token_ids: list[int]) -> None:
        """Offer the row's full blocks holding ``token_ids`` (its first tokens, K/V written) to
        later requests."""
        registered = self._registered[slot]
        table, size = self.tables[slot], self.block_size
        full = min(len(token_ids) // size, len(table))
        if full > registered.num_blocks:
            token_ids = keyed(token_ids, self.media[slot])
        for index in range(registered.num_blocks, full):
            tokens = tuple(token_ids[index * size : (index + 1) * size])
            registered.parent = self.blocks.register(registered.parent, tokens, table[index])
        registered.num_blocks = max(registered.num_blocks, full)

    # ---- preemption ------------------------------------------------------------------------------
    def swap_out(self, slots: list[int]) -> SwappedRows:
        """Copy the rows' blocks out of the pool, each shared block once, and let them go (the
        request is preempted)."""
        distinct: dict[int, int] = {}  # block -> its index in the copy, in first-seen order
        tables = {slot: [distinct.setdefault(block, len(distinct)) for block in self.tables[slot]] for slot in slots}
        keys = values = None
        if distinct:
            index = torch.tensor(list(distinct), dtype=torch.long, device=self.keys[0].device)
            keys = torch.stack([layer_keys[index] for layer_keys in self.keys])
            values = torch.stack([layer_values[index] for layer_values in self.values])
        for slot in slots:
            self.truncate(slot, 0)
        return SwappedRows(keys, values, tables)

    def swap_in(self, swapped: SwappedRows) -> None:
        """Put a preempted request's K/V back: one fresh block per copy (``swapped.num_blocks`` must be
        free), held by as many of its rows as held the original, so later writes copy on write again."""
        fresh = [self.blocks.take() for _ in range(swapped.num_blocks)]
        taken = [False] * len(fresh)
        for slot, indices in swapped.tables.items():
            self.truncate(slot, 0)
            for index in indices:
                if taken[index]:
                    self.blocks.share(fresh[index])
                taken[index] = True
            self.tables[slot] = [fresh[index] for index in indices]
        if fresh:
            index = torch.tensor(fresh, dtype=torch.long, device=self.keys[0].device)
            for layer, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
                k[index] = swapped.keys[layer]
                v[index] = swapped.values[layer]


def bytes_per_block(config: object, block_size: int, dtype: torch.dtype) -> int:
    """K and V of every layer for ``block_size`` positions."""
    num_kv_heads, key_dim, value_dim = kv_shape(config)
    return cached_layers(config) * num_kv_heads * (key_dim + value_dim) * block_size * dtype.itemsize


def kv_shape(config: object) -> tuple[int, int, int]:
    """``(num_kv_heads, key_head_dim, value_head_dim)`` a layer caches per position, from the config.

    Families without grouped K/V (GPT-2, GPT-NeoX) have as many K/V heads as query heads; MLA
    (DeepSeek V3) caches its decompressed keys (``qk_nope_head_dim + qk_rope_head_dim``) and
    narrower values (``v_head_dim``).
    """
    if getattr(config, "is_encoder_decoder", False):  # the decoder's (the generic names are the encoder's)
        heads = getattr(config, "decoder_attention_heads", None) or config.num_heads  # T5: num_heads, d_kv
        head_dim = getattr(config, "d_kv", None) or config.d_model // heads
        return heads, head_dim, head_dim
    num_kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    key_dim = getattr(config, "qk_head_dim", None) or head_dim
    value_dim = getattr(config, "v_head_dim", None) or key_dim
    return num_kv_heads, key_dim, value_dim


def cached_layers(config: object) -> int:
    """Layers whose K/V the pool holds: the decoder's (an encoder-decoder's ``num_hidden_layers`` is its
    encoder's); each also holds its cross-attention's encoder K/V under the request's cross slot."""
    if getattr(config, "is_encoder_decoder", False):
        return getattr(config, "decoder_layers", None) or config.num_decoder_layers  # T5's num_decoder_layers
    return config.num_hidden_layers
