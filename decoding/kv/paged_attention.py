"""Decode attention over the paged KV cache: every single-token row of a step in one call.

Two implementations of one function. The native one (``paged_decode.cpp``, a PyTorch operator
library compiled with the system C++ compiler against the installed torch on first use and loaded
only from a directory and file no other user can write: ``native_kernel``) reads each row's blocks
where they lie; a compiled one-token forward calls it from every layer with no Python in between
(``published_step``, ``step_attention``).
Without a compiler (or on a GPU) the rows' blocks are gathered into a dense tensor and fed to
``grouped_attention``: the same numbers, at the price of copying the cache once per layer.
``DECODA_PAGED_KERNEL=torch`` forces the fallback (the tests compare the two).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from decoding.kv.native_kernel import build_operators

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("paged_decode.cpp")
SUPPORTED = (torch.float32, torch.bfloat16)

_loaded: list[bool] = []  # [True] once the operators are loaded in this process, [False] when unavailable
_loading = threading.Lock()  # the start-up builds it in the background (decoding.engine.prebuild)


def paged_decode(
    query: torch.Tensor,  # [rows, num_heads, head_dim]
    keys: torch.Tensor,  # [num_blocks, num_kv_heads, block_size, head_dim]
    values: torch.Tensor,
    tables: torch.Tensor,  # int64 [rows, max_blocks]
    lengths: torch.Tensor,  # int64 [rows]: positions 0..length-1 exist
    firsts: torch.Tensor,  # int64 [rows]: first position a row may see (sliding window), else 0
    scaling: float,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Softmax attention of each row's query over its own cached positions ``firsts..lengths-1``.

    ``softcap`` (Gemma 2's ``tanh`` capping of the scores), ``sinks`` (gpt-oss: one extra logit per
    head in the softmax's denominator) and values narrower than keys (MLA) take the gathering path:
    the native kernel computes plain softmax attention over K and V of one head size only.
    """
    plain = softcap is None and sinks is None and keys.shape[-1] == values.shape[-1]
    native = plain and keys.device.type == "cpu" and keys.dtype in SUPPORTED
    if not (native and native_available()):
        return _gathered(query, keys, values, tables, lengths, firsts, scaling, softcap, sinks)
    return torch.ops.decoda_paged.decode(query, keys, values, tables, lengths, firsts, scaling)


def paged_write_decode(
    query: torch.Tensor,  # [num_heads, num_tokens, head_dim], decode rows' tokens first (any strides, last 1)
    key: torch.Tensor,  # [num_kv_heads, num_tokens, head_dim]: every packed token's new K
    value: torch.Tensor,  # [num_kv_heads, num_tokens, head_dim]
    keys: torch.Tensor,  # the layer's pool [num_blocks, num_kv_heads, block_size, head_dim]
    values: torch.Tensor,
    token_blocks: torch.Tensor,  # int64 [num_tokens]: the block each token's K/V goes to
    token_offsets: torch.Tensor,  # int64 [num_tokens]: its offset in that block
    tables: torch.Tensor,  # int64 [rows, max_blocks]: the decode rows' block tables
    lengths: torch.Tensor,
    firsts: torch.Tensor,
    scaling: float,
) -> torch.Tensor | None:
    """Write every token's K/V into the pool, then attend the first ``rows`` (decode) tokens: ONE call.

    The layer's cache work at a one-row step was four dispatched PyTorch ops around the kernel
    (two index_put writes, the query's copy to float32, the output's cast back), about as long as
    the attention itself; here the kernel reads the model's own strided tensors and writes the
    pool and the output in their dtypes. ``None`` when it cannot (no native kernel, another dtype
    or device, a stride it does not read): the caller takes the PyTorch path, with the same numbers.
    """
    tensors = (query, key, value, keys, values)
    if (
        query.device.type != "cpu"
        or any(t.dtype not in SUPPORTED or t.stride(-1) != 1 for t in tensors)
        or key.dtype != value.dtype
        or keys.dtype != values.dtype
        or not (keys.is_contiguous() and values.is_contiguous())
        or keys.shape[-1] != values.shape[-1]
        or key.shape[-1] != keys.shape[-1]
        or key.shape[0] != keys.shape[1]
        or tables.shape[0] == 0
        or not native_available()
    ):
        return None
    write_decode = torch.ops.decoda_paged.write_decode
    return write_decode(query, key, value, keys, values, token_blocks, token_offsets, tables, lengths, firsts, scaling)


@contextmanager
def published_step(
    keys: Sequence[torch.Tensor],  # the pool, one tensor a layer
    values: Sequence[torch.Tensor],
    token_blocks: torch.Tensor,
    token_offsets: torch.Tensor,
    tables: torch.Tensor,  # the decode rows' block tables: every token of the step is a decode row's
    lengths: torch.Tensor,
) -> Iterator[None]:
    """Make a decode-only step's tables what ``step_attention`` reads on this thread, for one forward.

    A compiled one-token forward's layers call the native operator directly; the tables cannot be
    an argument of each layer's attention without threading them through the model's forward, so
    they travel beside it, as the Python layout does for the custom op (one call a step, not a layer).
    """
    torch.ops.decoda_paged.set_step(list(keys), list(values), token_blocks, token_offsets, tables, lengths)
    try:
        yield
    finally:
        torch.ops.decoda_paged.clear_step()


def step_attention_serves(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether ``step_attention`` can stand for the whole attention of a one-token compiled step:
    plain softmax attention (the caller rules out soft-capping and sinks) on a CPU kernel dtype."""
    return (
        query.device.type == "cpu"
        and all(t.dtype in SUPPORTED for t in (query, key, value))
        and key.dtype == value.dtype
        and key.shape[-1] == value.shape[-1] == query.shape[-1]
        and native_available()
    )


def step_attention(
    query: torch.Tensor,  # [1, num_heads, 1, head_dim]
    key: torch.Tensor,  # [1, num_kv_heads, 1, head_dim]
    value: torch.Tensor,
    layer: torch.Tensor,  # 0-d int64: which of the published pool's layers
    scaling: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """``[1, 1, num_heads, head_dim]``: the layer's new K/V written and its one decode row attended,
    from the tables ``published_step`` made current (a graph calls the operator through the dispatcher)."""
    window = 0 if sliding_window is None else int(sliding_window)
    return torch.ops.decoda_paged.step_attention(query, key, value, layer, scaling, window)


def _gathered(query, keys, values, tables, lengths, firsts, scaling, softcap=None, sinks=None):  # noqa: ANN001, ANN202
    rows, max_blocks = tables.shape
    kv_heads, block, head_dim = keys.shape[1:]
    span = max_blocks * block
    k = keys[tables].transpose(1, 2).reshape(rows, kv_heads, span, head_dim)
    v = values[tables].transpose(1, 2).reshape(rows, kv_heads, span, values.shape[-1])
    position = torch.arange(span, device=keys.device)
    allowed = (position[None, :] < lengths[:, None]) & (position[None, :] >= firsts[:, None])
    bias = torch.zeros(allowed.shape, dtype=torch.float32, device=keys.device).masked_fill_(~allowed, float("-inf"))
    hidden = ~allowed[:, None, :, None]  # never-written positions may hold nan, and nan * 0 is nan
    k, v = k.masked_fill(hidden, 0.0), v.masked_fill(hidden, 0.0)
    out = grouped_attention(query.unsqueeze(2), k, v, bias[:, None, None, :], scaling, softcap, sinks)
    return out.squeeze(2)


def native_available() -> bool:
    """True when the native operators are loaded (built here on first use)."""
    if not _loaded:
        with _loading:  # one build: a second thread waits for it
            if not _loaded:
                _loaded.append(os.environ.get("DECODA_PAGED_KERNEL") != "torch" and _load())
    return _loaded[0]


def _load() -> bool:
    if build_operators(SOURCE, "paged_decode", _register_fakes) is None:
        logger.warning("paged attention kernel unavailable: decode attention gathers the cache (slower)")
        return False
    return True


def _register_fakes() -> None:
    """The output shapes a compiled graph traces (only step_attention appears in one)."""

    def step_shape(query, key, value, layer, scale, window):  # noqa: ANN001, ANN202
        return query.new_empty((1, query.shape[2], query.shape[1], value.shape[3]))

    torch.library.register_fake("decoda_paged::step_attention", step_shape)



def grouped_attention(
    query: torch.Tensor,  # [batch, num_heads, num_queries, head_dim]
    keys: torch.Tensor,  # [batch, num_kv_heads, kv_len, head_dim]
    values: torch.Tensor,  # [batch, num_kv_heads, kv_len, head_dim]
    bias: torch.Tensor,  # float32 [batch, 1, 1 or num_queries, kv_len]: 0 where a query may attend, -inf elsewhere
    scaling: float,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,  # [num_heads]: a per-head logit every query also weighs (gpt-oss)
) -> torch.Tensor:
    """Softmax attention with grouped K/V heads, as two batched matmuls.

    Query head ``h`` reads K/V head ``h // group`` (transformers' ``repeat_kv``), so the query heads
    of one group are stacked as extra query rows and the pool's K/V are read once per group,
    never repeated. Scores and softmax are float32 whatever the model dtype. For decode rows
    (one query each) this beats PyTorch's CPU flash kernel: 16 rows at ~200 positions take
    226 us instead of 322 in float32 and 311 instead of 1598 in bfloat16 (whose flash path is
    slow on CPU); for many float32 queries at once (prefill) the flash kernel wins, so those keep
    it (in bfloat16 this function would win there too: 3.4 ms vs 4.7 for a 512-token chunk).

    It is also the one path for what the fast kernels lack, in the order transformers' eager
    attention applies them: scores soft-capped (``softcap * tanh(scores / softcap)``) before the
    mask, and sink logits joining the softmax then dropped. Values may be narrower than keys (MLA).
    """
    batch, num_heads, num_queries, head_dim = query.shape
    num_kv_heads, kv_len = keys.shape[1], keys.shape[2]
    group = num_heads // num_kv_heads
    grouped = query.reshape(batch, num_kv_heads, group * num_queries, head_dim)
    scores = torch.matmul(grouped, keys.transpose(-1, -2)).float()  # [batch, kv_heads, group*queries, kv_len]
    scores = scores.view(batch, num_kv_heads, group, num_queries, kv_len).mul_(scaling)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores += bias.view(bias.shape[0], 1, 1, bias.shape[-2], kv_len)
    if sinks is not None:
        sink = sinks.float().view(1, num_kv_heads, group, 1, 1).expand(batch, -1, -1, num_queries, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :kv_len]
    else:
        probs = torch.softmax(scores, dim=-1)
    probs = probs.to(values.dtype).reshape(batch, num_kv_heads, group * num_queries, kv_len)
    out = torch.matmul(probs, values)  # [batch, kv_heads, group*queries, value_dim]
    return out.view(batch, num_heads, num_queries, values.shape[-1])
