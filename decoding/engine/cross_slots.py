"""The cross slot an encoder-decoder request holds beside its rows: its encoder's keys and values.

A request of an encoder-decoder model needs one pool slot more than its strategy's rows: the slot its
encoder's keys and values are written into once (``engine/encoder_stage.py``), read by every row's
cross-attention (``model/cross_attention.py``). The scheduler counts it like the rows' blocks: in
admission, preemption (swapped out and in with the rows) and at the end (freed, never offered to the
prefix cache: a decoder prompt's K/V depend on the encoder's input, so the same decoder tokens of another
request are not the same K/V).
"""

from __future__ import annotations

from decoding.kv.pool import KVPool
from decoding.strategies import DecodingStrategy


def has_encoder(strategy: DecodingStrategy) -> bool:
    """Whether the request is an encoder-decoder model's (a request made elsewhere may carry no such field)."""
    return getattr(strategy.request, "encoder_input", None) is not None


def handles_needed(strategy: DecodingStrategy) -> int:
    """Pool slots the request takes to start: its rows, and its cross slot."""
    return strategy.num_slots + (1 if has_encoder(strategy) else 0)


def cross_blocks(pool: KVPool, strategy: DecodingStrategy) -> int:
    """Blocks the request's encoder keys and values fill."""
    request = strategy.request
    return pool.blocks_for(request.encoder_length) if has_encoder(strategy) else 0


def hold(pool: KVPool, strategy: DecodingStrategy) -> None:
    """Give a starting request its cross slot (with its blocks) and point its rows at it."""
    request = strategy.request
    if not has_encoder(strategy):
        return
    slot = pool.allocate()
    pool.prepare(slot, 0, request.encoder_length)
    pool.cross_lengths[slot] = request.encoder_length
    for row_slot in strategy.held_slots():
        pool.cross_slots[row_slot] = slot
    request.cross_slot = slot


def held(strategy: DecodingStrategy) -> list[int]:
    """The request's cross slot, if it holds one (preemption swaps it out with the rows)."""
    slot = getattr(strategy.request, "cross_slot", None)
    return [] if slot is None else [slot]


def let_go(pool: KVPool, strategy: DecodingStrategy) -> None:
    """Free the request's cross slot and forget which rows read it."""
    request = strategy.request
    if getattr(request, "cross_slot", None) is None:
        return
    for row_slot in [row for row, cross in pool.cross_slots.items() if cross == request.cross_slot]:
        del pool.cross_slots[row_slot]
    pool.cross_lengths.pop(request.cross_slot, None)
    pool.free(request.cross_slot)
    request.cross_slot = None
    request.encoded = False
