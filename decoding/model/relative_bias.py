"""Attention with T5's relative position bias over the paged KV cache.

T5's decoder self-attention adds a learned bias to every score, looked up by the bucketed distance
between the key's and the query's positions (the first layer's table, shared by every layer), and does
not scale the dot product. transformers computes that bias for the whole input as one sequence; packed
rows each start at their own position, so here each row's bias is computed from its own positions (a
contrastive candidate's scratch keys stand at its position, as they would in its own sequence), added to
its causal mask, and the row attends over its blocks gathered in order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attend_with_relative_bias(layout: object, layer: int, query: torch.Tensor, key: torch.Tensor,
                              value: torch.Tensor, scaling: float, table: torch.nn.Module) -> torch.Tensor:  # fmt: skip
    """``layout``: the step's ``attention.StepLayout``; ``table``: the T5 attention module holding the bias
    embedding. Writes the new K/V into the pool, returns ``[1, num_tokens, heads, head_dim]``."""
    pool = layout.pool
    keys, values = pool.keys[layer], pool.values[layer]
    keys[layout.token_blocks, :, layout.token_offsets] = key[0].transpose(0, 1).to(keys.dtype)
    values[layout.token_blocks, :, layout.token_offsets] = value[0].transpose(0, 1).to(values.dtype)
    heads, dim = keys.shape[1], keys.shape[3]
    outputs, offset, multi = [], 0, 0
    for seg in layout.segments:
        span = seg.start + seg.length
        blocks = torch.tensor(pool.tables[seg.slot][: pool.blocks_for(span)], dtype=torch.long, device=query.device)
        k = keys[blocks].transpose(0, 1).reshape(1, heads, -1, dim)[:, :, :span].to(query.dtype)
        v = values[blocks].transpose(0, 1).reshape(1, heads, -1, values.shape[3])[:, :, :span].to(query.dtype)
        q_positions = layout.token_positions[offset : offset + seg.length]
        kv_positions = torch.arange(span, device=query.device)
        if seg.siblings:
            kv_positions = kv_positions.clamp(max=seg.start)
        bias = _bias(table, kv_positions[None, :] - q_positions[:, None])  # [heads, length, span]
        if seg.length > 1:
            allowed = layout.multi_mask(multi, None)
            multi += 1
            bias = bias.masked_fill(~allowed[None], float("-inf"))
        q = query[:, :, offset : offset + seg.length]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias[None].to(q.dtype), scale=scaling)
        outputs.append(out[0].transpose(0, 1))
        offset += seg.length
    return torch.cat(outputs, dim=0).unsqueeze(0)


def _bias(table: torch.nn.Module, relative: torch.Tensor) -> torch.Tensor:
    buckets = table._relative_position_bucket(relative, bidirectional=not table.is_decoder,
                                              num_buckets=table.relative_attention_num_buckets,
                                              max_distance=table.relative_attention_max_distance)  # fmt: skip
    return table.relative_attention_bias(buckets).permute(2, 0, 1)
