"""Cross-attention of packed decoder tokens over their request's encoder keys and values.

An encoder-decoder request keeps its encoder's keys and values in the pool under its cross slot
(``decoding.model.seq2seq``); ``KVPool.cross_slots`` maps each of its rows to that slot. Every query
token sees all of its request's encoder positions (no mask): one-token rows are one paged-decode call
over the cross slots' blocks, read in place, as self-attention's decode rows are; a multi-token row (the
decoder prompt, a draft) attends over its cross slot's blocks gathered in order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from decoding.kv.paged_attention import paged_decode
from decoding.kv.pool import KVPool


class CrossLayout:
    """Where each packed row's encoder keys and values are: built once per step, shared by the layers."""

    def __init__(self, pool: KVPool, decode: list, multi: list, device: torch.device) -> None:
        """``decode``, ``multi``: the step's one-token and many-token ``attention.Segment``s, in packed order."""
        self.pool = pool
        lengths = pool.cross_lengths
        decode_slots = [pool.cross_slots[seg.slot] for seg in decode]
        if decode_slots:
            width = max(len(pool.tables[slot]) for slot in decode_slots)
            tables = [(pool.tables[slot] + [0] * width)[:width] for slot in decode_slots]
            self.decode_tables = torch.tensor(tables, dtype=torch.long, device=device)
            self.decode_lengths = torch.tensor([lengths[slot] for slot in decode_slots], dtype=torch.long,
                                               device=device)  # fmt: skip
            self.decode_firsts = torch.zeros_like(self.decode_lengths)
        self.multi = [
            (torch.tensor(pool.tables[pool.cross_slots[seg.slot]], dtype=torch.long, device=device),
             lengths[pool.cross_slots[seg.slot]], seg.length)
            for seg in multi
        ]  # fmt: skip
        self.num_decode = len(decode_slots)

    def attend(self, layer: int, query: torch.Tensor, scaling: float) -> torch.Tensor:
        """``query`` ``[1, heads, num_tokens, head_dim]`` (decode rows' tokens first) → ``[1, num_tokens,
        heads, head_dim]``."""
        keys, values = self.pool.keys[layer], self.pool.values[layer]
        outputs: list[torch.Tensor] = []
        if self.num_decode:
            q = query[0, :, : self.num_decode].transpose(0, 1)  # [num_decode, heads, head_dim]
            outputs.append(paged_decode(q, keys, values, self.decode_tables, self.decode_lengths, self.decode_firsts,
                                        scaling))  # fmt: skip
        offset = self.num_decode
        for blocks, length, count in self.multi:
            q = query[:, :, offset : offset + count]
            heads, dim = keys.shape[1], keys.shape[3]
            k = keys[blocks].transpose(0, 1).reshape(1, heads, -1, dim)[:, :, :length]
            v = values[blocks].transpose(0, 1).reshape(1, heads, -1, values.shape[3])[:, :, :length]
            outputs.append(F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), scale=scaling)[0]
                           .transpose(0, 1))  # fmt: skip
            offset += count
        attn = torch.cat(outputs, dim=0) if len(outputs) > 1 else outputs[0]
        return attn.unsqueeze(0)
