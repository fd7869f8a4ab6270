"""Who holds which KV block, and which full blocks a later request can reuse (prefix caching).

A block is ``block_size`` consecutive positions of one sequence. Blocks are reference counted:
rows that share a prefix (a request's ``n`` rows, beams, requests with the same system prompt)
hold the same blocks, and a row about to write into a shared block gets its own copy first
(copy-on-write, done by the pool). A full block of known tokens can be *registered* under the key
``(parent key, its token ids)``: the chain of keys names the whole prefix, so equal keys mean
equal K/V. Keys are compared whole (not hashed), so two prefixes can never be confused. When its
last holder lets go, a registered block is not wiped: it waits, least recently used first, until
a new request matches it or the pool needs the space (vLLM's automatic prefix caching).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

ROOT = 0  # the parent entry of a sequence's first block (the base model's)


def adapter_root(adapter_uid: int) -> int:
    """The parent entry of a sequence's first block under a LoRA adapter (its never-reused load id,
    ``model.lora.residency``): negative, so it is no registered entry's id and no other adapter's root.
    K/V computed through one adapter's projections are keyed under its own root: two adapters (or an
    adapter and the base) never share blocks for the same prompt."""
    return ROOT if adapter_uid == 0 else -adapter_uid


class OutOfBlocksError(RuntimeError):
    """The pool has no free block left; the scheduler preempts a request and tries again."""


class BlockAllocator:
    def __init__(self, num_blocks: int, *, prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.prefix_caching = prefix_caching
        self.refs = [0] * num_blocks
        # never used or wiped, lowest first: the blocks in use stay packed at the front, so the
        # pool's untouched pages are never made resident (it is allocated uninitialised)
        self._free: list[int] = list(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, held by nobody; LRU first
        self._entries: dict[tuple[int, tuple[int, ...]], tuple[int, int]] = {}  # key -> (block, entry id)
        self._key_of: dict[int, tuple[int, tuple[int, ...]]] = {}  # registered block -> its key
        self._next_entry = ROOT + 1

    # ---- counting --------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks a new holder can take now: the wiped ones and the cached ones nobody holds."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        return len(self._key_of)

    # ---- holding -------------------------------------------------------------------------------------
    def take(self) -> int:
        """A block for one new holder: a never-used one first, else the least recently used cached one."""
        if self._free:
            block = heapq.heappop(self._free)
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            self._forget(block)
        else:
            raise OutOfBlocksError("no free KV block")
        self.refs[block] = 1
        return block

    def share(self, block: int) -> None:
        """One more holder of ``block`` (a cached block nobody held comes back into use)."""
        if self.refs[block] == 0:
            self._evictable.pop(block)
        self.refs[block] += 1

    def release(self, block: int) -> None:
        if self.refs[block] <= 0:
            raise ValueError(f"KV block {block} released more often than held")
        self.refs[block] -= 1
        if self.refs[block] == 0:
            if block in self._key_of:
                self._evictable[block] = None  # most recently used last
            else:
                heapq.heappush(self._free, block)

    def is_shared(self, block: int) -> bool:
        return self.refs[block] > 1

    def before_write(self, block: int) -> None:
        """A holder writes into ``block`` it holds alone: its registered content no longer holds."""
        if block in self._key_of:
            self._forget(block)

    # ---- the prefix cache ----------------------------------------------------------------------------
    def register(self, parent: int, tokens: tuple[int, ...], block: int) -> int:
        """Record that ``block`` holds the K/V of ``tokens`` after the prefix ``parent``; returns the
        entry the next block's key refers to. A prefix already cached keeps its first block."""
        key = (parent, tokens)
        found = self._entries.get(key)
        if found is not None:
            return found[1]
        entry = self._next_entry
        self._next_entry += 1
        if self.prefix_caching and block not in self._key_of:
            self._entries[key] = (block, entry)
            self._key_of[block] = key
        return entry

    def match(self, token_ids: list[int], block_size: int, max_tokens: int, root: int = ROOT) -> list[int]:
        """The cached blocks holding the longest prefix of ``token_ids`` (at most ``max_tokens``
        tokens, in whole blocks) under ``root`` (``adapter_root``), in order; the caller ``share``s the
        ones it keeps."""
        blocks: list[int] = []
        if not self.prefix_caching:
            return blocks
        parent = root
        for begin in range(0, max_tokens - block_size + 1, block_size):
            found = self._entries.get((parent, tuple(token_ids[begin : begin + block_size])))
            if found is None:
                break
            block, parent = found
            blocks.append(block)
        for block in reversed(blocks):  # a hit is a use: kept from eviction longest, its tail going first
            if block in self._evictable:
                self._evictable.move_to_end(block)
        return blocks

    def _forget(self, block: int) -> None:
        key = self._key_of.pop(block)
        del self._entries[key]
