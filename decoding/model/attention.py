"""Decoda's attention function: packed tokens of many rows against the paged KV cache, in one forward.

The runner flattens every row's new tokens into one sequence ``[1, num_tokens]`` so the model's
projections and MLPs run as one matmul with no padding. Attention is the only place rows must be
kept apart; transformers lets a model call a registered attention function (``AttentionInterface``)
with the new keys/values, and this one:

1. writes the new K/V into the pool at each token's own (block, offset), found through its row's
   block table (the pool made those positions writable before the forward: ``KVPool.prepare``);
2. runs all single-token rows (decode steps) as ONE call reading every row's blocks in place
   (``paged_attention.paged_decode``), each row masked to its own length; where the native kernel
   serves, steps 1 and 2 are one call (``paged_write_decode``), with no PyTorch op around it; a
   compiled one-token forward's layers call that operator straight from the graph
   (``paged_attention.step_attention``, the step's tables published once by ``active_layout``);
3. runs each multi-token row (a prompt chunk, a draft to verify) as its own attention over its
   blocks gathered in order, with a causal mask offset by the row's cached length, or, for
   contrastive-search candidates (sibling tokens at one position), a mask that lets each see the
   prefix and itself only.

It matches transformers' ``sdpa_attention_forward`` numerically up to float reassociation; the
masks follow ``masking_utils`` (causal; sliding window ``q - kv < window`` for local layers). What
makes a family's attention its own comes as data with each call, never as a model name: the
layer's ``sliding_window`` (None on global layers), Gemma 2's ``softcap``, gpt-oss's sinks
(``s_aux``), MLA's values narrower than its keys; those without a fast kernel take
``paged_attention.grouped_attention``, which applies them as transformers' eager attention does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from decoding.kv.media_rows import both_ways, rope_positions
from decoding.kv.paged_attention import (
    grouped_attention,
    native_available,
    paged_decode,
    paged_write_decode,
    published_step,
    step_attention,
    step_attention_serves,
)
from decoding.kv.pool import KVPool
from decoding.model.compile import LAYER_BUFFER
from decoding.model.cross_attention import CrossLayout
from decoding.model.relative_bias import attend_with_relative_bias
from decoding.model.seq2seq import CROSS_LAYER, RELATIVE_BIAS

ATTENTION_NAME = "decoda"
LAYOUT_KWARG = "decoda_layout"  # the model forwards this keyword down to every attention call


@dataclass(frozen=True)
class Segment:
    """The tokens one row feeds this step: ``length`` tokens at positions ``start..start+length-1``.

    ``siblings``: the tokens are alternatives for the SAME position ``start`` (contrastive search
    candidates): all get rotary position ``start``, each sees the row's prefix and itself only, and
    their K/V land in scratch positions ``start..start+length-1`` until the caller keeps one.
    """

    slot: int
    start: int
    length: int
    siblings: bool = False


class StepLayout:
    """Where each packed token lives and who may see whom; built once per forward, shared by layers.

    Decode segments (length 1) must come first in ``segments``: their tokens occupy the first
    ``num_decode`` packed positions.
    """

    def __init__(self, pool: KVPool, segments: list[Segment], device: torch.device) -> None:
        self.pool = pool
        self.segments = segments
        self.decode = [s for s in segments if s.length == 1]
        self.multi = [s for s in segments if s.length > 1]
        if segments[: len(self.decode)] != self.decode:
            raise ValueError("decode segments must come first")
        size = pool.block_size
        blocks: list[int] = []  # where each token's K/V is written: (block, offset)
        offsets: list[int] = []
        rotary: list[int] = []  # the position the model sees
        for seg in segments:
            table = pool.tables[seg.slot]
            for position in range(seg.start, seg.start + seg.length):
                blocks.append(table[position // size])
                offsets.append(position % size)
            rotary.extend([seg.start] * seg.length if seg.siblings else range(seg.start, seg.start + seg.length))
        self.num_tokens = len(blocks)
        self.token_blocks = torch.tensor(blocks, dtype=torch.long, device=device)  # [num_tokens]
        self.token_offsets = torch.tensor(offsets, dtype=torch.long, device=device)  # [num_tokens]
        self.token_positions = torch.tensor(rotary, dtype=torch.long, device=device)  # [num_tokens]
        self.device = device
        # [3, num_tokens] Qwen2-VL's M-RoPE positions when a row's prompt holds images; None: 1D positions serve
        self.rope_positions = _rope_positions(pool, segments, self.token_positions)
        self._masks: dict[tuple[str, int | None], torch.Tensor] = {}
        self._multi_blocks = [
            torch.tensor(pool.tables[seg.slot][: pool.blocks_for(seg.start + seg.length)], dtype=torch.long,
                         device=device)
            for seg in self.multi
        ]  # fmt: skip
        # an encoder-decoder model's rows also read their request's encoder keys and values
        self.cross = CrossLayout(pool, self.decode, self.multi, device) if pool.cross_slots is not None else None
        if self.decode:
            width = max(pool.blocks_for(seg.start + 1) for seg in self.decode)
            tables = [(pool.tables[seg.slot] + [0] * width)[:width] for seg in self.decode]
            self.decode_tables = torch.tensor(tables, dtype=torch.long, device=device)  # [num_decode, width]
            self.decode_lengths = torch.tensor([s.start + 1 for s in self.decode], dtype=torch.long, device=device)

    @classmethod
    def decode_only(cls, pool: KVPool, tokens: dict[str, torch.Tensor]) -> StepLayout:
        """A layout of ``rows`` one-token rows over caller-owned tensors (a CUDA graph's static inputs:
        ``token_blocks``, ``token_offsets``, ``token_positions``, ``decode_tables``, ``decode_lengths``),
        whose values the caller rewrites before each replay; nothing here reads them on the host."""
        layout = cls.__new__(cls)
        rows = tokens["token_blocks"].shape[0]
        layout.pool, layout.device = pool, tokens["token_blocks"].device
        layout.segments = layout.decode = [Segment(0, 0, 1)] * rows
        layout.multi, layout._multi_blocks, layout._masks, layout.cross = [], [], {}, None
        layout.rope_positions = None
        layout.num_tokens = rows
        for name, tensor in tokens.items():
            setattr(layout, name, tensor)
        return layout

    def decode_firsts(self, sliding_window: int | None) -> torch.Tensor:
        """``[num_decode]`` the first position each decode row may see (its sliding window's start)."""
        key = ("firsts", sliding_window)
        if key not in self._masks:
            if sliding_window is None:
                self._masks[key] = torch.zeros_like(self.decode_lengths)
            else:  # kv > q - window, with q = length - 1
                self._masks[key] = (self.decode_lengths - sliding_window).clamp_(min=0)
        return self._masks[key]

    def multi_kv(self, index: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The index-th multi-token segment's K and V ``[1, num_kv_heads, start + length, head_dim]``."""
        seg, blocks = self.multi[index], self._multi_blocks[index]
        pool, span = self.pool, seg.start + seg.length
        keys, values = pool.keys[layer][blocks], pool.values[layer][blocks]  # [n, kv_heads, block, dim]
        kv_heads = keys.shape[1]
        k = keys.transpose(0, 1).reshape(1, kv_heads, -1, keys.shape[3])[:, :, :span]
        v = values.transpose(0, 1).reshape(1, kv_heads, -1, values.shape[3])[:, :, :span]
        return k, v

    def multi_mask(self, index: int, sliding_window: int | None) -> torch.Tensor:
        """``[length, start + length]`` bool causal mask of the index-th multi-token segment."""
        key = (f"multi{index}", sliding_window)
        if key not in self._masks:
            seg = self.multi[index]
            q = torch.arange(seg.start, seg.start + seg.length, device=self.device)
            kv = torch.arange(seg.start + seg.length, device=self.device)
            if seg.siblings:  # the shared prefix, then each candidate's own scratch position
                mask = (kv[None, :] < seg.start) | (kv[None, :] == q[:, None])
                if sliding_window is not None:
                    mask &= (kv[None, :] > seg.start - sliding_window) | (kv[None, :] >= seg.start)
            else:
                mask = kv[None, :] <= q[:, None]
                for start, end in both_ways(self.pool.media[seg.slot], seg.start, seg.start + seg.length):
                    # Gemma 3's image tokens see each other both ways (transformers' blockwise overlay)
                    mask |= ((q >= start) & (q < end))[:, None] & ((kv >= start) & (kv < end))[None, :]
                if sliding_window is not None:
                    mask &= kv[None, :] > q[:, None] - sliding_window
            self._masks[key] = mask
        return self._masks[key]


def _rope_positions(pool: KVPool, segments: list[Segment], positions: torch.Tensor) -> torch.Tensor | None:
    """``[3, num_tokens]``: each row's M-RoPE positions (``kv.media_rows``), or None when no row has any."""
    if not any(pool.media[seg.slot] is not None and pool.media[seg.slot].rope is not None for seg in segments):
        return None
    parts, offset = [], 0
    for seg in segments:
        parts.append(rope_positions(positions[offset : offset + seg.length], pool.media[seg.slot]))
        offset += seg.length
    return torch.cat(parts, dim=1)


_active: list[StepLayout | None] = [None]


@contextmanager
def active_layout(layout: StepLayout, compiled: bool = False) -> Iterator[None]:
    """Make ``layout`` the one every attention layer of the next COMPILED forward uses.

    An eager forward gets its layout as a keyword argument (``LAYOUT_KWARG``). A
    ``torch.compile``d forward must see only tensors (a new Python object per step would re-trigger
    its guards), so for it the layout travels beside the call, read by the opaque custom op; a
    compiled one-token step's layers call the native operator instead, which reads the step's
    tables from ``published_step``.
    """
    _active[0] = layout
    try:
        # a lone token is a decode row; the graph chose the operator at trace time where it is built
        if compiled and layout.num_tokens == 1 and native_available():
            with published_step(layout.pool.keys, layout.pool.values, layout.token_blocks, layout.token_offsets,
                                layout.decode_tables, layout.decode_lengths):  # fmt: skip
                yield
        else:
            yield
    finally:
        _active[0] = None


@torch.library.custom_op("decoda::packed_attention", mutates_args=())
def packed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layer: torch.Tensor,
    scaling: float,
    sliding_window: int,
    softcap: float,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Opaque to the compiler: writes the pool, then attends (``sliding_window`` -1 and ``softcap`` 0 mean none).

    ``layer`` is a 0-d tensor, not an int: as a graph input it lets every layer share one traced
    subgraph (``decoding.model.compile``), where an int would be a different constant in each.
    """
    window = None if sliding_window < 0 else sliding_window
    # contiguous, as the fake promises (the compiled graph asserts strides): SDPA's output already is
    # once transposed, the soft-cap/sink/MLA path's is not
    index = int(layer)
    return _attend(_current_layout(), index, query, key, value, scaling, window, softcap or None, sinks).contiguous()


def _current_layout() -> StepLayout:
    layout = _active[0]
    if layout is None:
        raise RuntimeError("decoda attention called outside active_layout() (use the model runner)")
    return layout


@packed_attention.register_fake
def _packed_attention_shape(query, key, value, layer, scaling, sliding_window, softcap, sinks):  # noqa: ANN001, ANN202
    return query.new_empty((1, query.shape[2], query.shape[1], value.shape[3]))


def decoda_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, num_heads, num_tokens, head_dim]
    key: torch.Tensor,  # [1, num_kv_heads, num_tokens, head_dim]
    value: torch.Tensor,  # [1, num_kv_heads, num_tokens, value_dim] (value_dim < head_dim for MLA)
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """The function transformers calls for ``attn_implementation="decoda"``.

    What makes one family's attention differ from another's arrives here as data the model's
    attention module passes: ``sliding_window`` per layer (None on a global layer), ``softcap``
    (Gemma 2's attention logit soft-capping), ``s_aux`` (gpt-oss's per-head attention sinks), and
    the K/V tensors' own head sizes (MLA's values are narrower than its keys).
    """
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    layout = kwargs.get(LAYOUT_KWARG)
    if layout is not None:  # eager: the layout came with the call, no custom-op dispatch (~0.1 ms a layer)
        if layout.cross is not None:  # an encoder-decoder model (a decoder-only one never looks)
            cross = getattr(module, CROSS_LAYER, None)
            if cross is not None:  # the keys and values the module computed are a stand-in's: the pool has them
                return layout.cross.attend(cross, query, float(scale)), None
            table = getattr(module, RELATIVE_BIAS, None)
            if table is not None:  # T5's decoder: each row's relative position bias, from its own positions
                return attend_with_relative_bias(layout, module.layer_idx, query, key, value, float(scale),
                                                 table), None  # fmt: skip
        return _attend(layout, module.layer_idx, query, key, value, float(scale), sliding_window, softcap, s_aux), None
    layer = getattr(module, LAYER_BUFFER, None)  # set by compile_model; a plain torch.compile gets a constant
    if layer is None:
        layer = torch.tensor(module.layer_idx, device=query.device)
    if _one_token_graph(query) and softcap is None and s_aux is None and step_attention_serves(query, key, value):
        # the one-user step: the native operator, called by the graph with no Python in between
        return step_attention(query, key, value, layer, float(scale), sliding_window), None
    window = -1 if sliding_window is None else int(sliding_window)
    cap = 0.0 if softcap is None else float(softcap)
    return packed_attention(query, key, value, layer, float(scale), window, cap, s_aux), None


def _one_token_graph(query: torch.Tensor) -> bool:
    """Tracing a graph specialized to one token (a lone decode row): the token count is the int 1,
    where the many-token graph's is a symbol (``decoding.model.compile``)."""
    tokens = query.shape[2]
    return torch.compiler.is_compiling() and isinstance(tokens, int) and tokens == 1


def _attend(
    layout: StepLayout,
    layer: int,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float,
    sliding_window: int | None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    pool = layout.pool
    layer_keys, layer_values = pool.keys[layer], pool.values[layer]
    num_decode = len(layout.decode)
    plain = softcap is None and sinks is None and key.shape[-1] == value.shape[-1]
    decoded = None  # [num_decode, num_heads, head_dim]
    if num_decode and plain:  # writes and decode attention in one native call, where it serves
        decoded = paged_write_decode(
            query[0], key[0], value[0], layer_keys, layer_values, layout.token_blocks, layout.token_offsets,
            layout.decode_tables, layout.decode_lengths, layout.decode_firsts(sliding_window), scaling,
        )  # fmt: skip
    if decoded is None:
        # [num_tokens, num_kv_heads, head_dim] written at (block, offset) of each token
        layer_keys[layout.token_blocks, :, layout.token_offsets] = key[0].transpose(0, 1).to(layer_keys.dtype)
        layer_values[layout.token_blocks, :, layout.token_offsets] = value[0].transpose(0, 1).to(layer_values.dtype)
        if num_decode:
            q = query[0, :, :num_decode].transpose(0, 1)  # [num_decode, num_heads, head_dim]
            decoded = paged_decode(
                q, layer_keys, layer_values, layout.decode_tables, layout.decode_lengths,
                layout.decode_firsts(sliding_window), scaling, softcap, sinks,
            )  # fmt: skip

    gqa = query.shape[1] != key.shape[1]
    outputs: list[torch.Tensor] = [] if decoded is None else [decoded]
    offset = num_decode
    for index, seg in enumerate(layout.multi):
        q = query[:, :, offset : offset + seg.length]  # [1, num_heads, length, head_dim]
        k, v = layout.multi_kv(index, layer)
        mask = layout.multi_mask(index, sliding_window)
        if plain:  # PyTorch's flash kernel: 1.1x to 3x faster than grouped_attention for many float32 queries
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling, enable_gqa=gqa)
        else:  # soft-capping, sinks or narrower values: what SDPA cannot express
            bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill_(~mask, float("-inf"))
            out = grouped_attention(q, k, v, bias[None, None], scaling, softcap, sinks)
        outputs.append(out[0].transpose(0, 1))  # [length, num_heads, head_dim]
        offset += seg.length
    attn = torch.cat(outputs, dim=0) if len(outputs) > 1 else outputs[0]
    return attn.unsqueeze(0)  # [1, num_tokens, num_heads, head_dim]


def _no_mask(*args: object, **kwargs: object) -> None:
    """Masks are built per step by StepLayout; transformers' mask construction is skipped."""
    return None


def register_attention() -> str:
    """Make ``attn_implementation="decoda"`` available to ``from_pretrained``; idempotent."""
    AttentionInterface.register(ATTENTION_NAME, decoda_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_mask)
    return ATTENTION_NAME
