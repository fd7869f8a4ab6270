"""Decode attention over the paged KV cache: every single-token row of a step in one call.

Two implementations of one function. The native one (``paged_decode.c``, compiled with the
system C compiler on first use and loaded with ctypes, only from a directory and file no other user
can write: ``native_kernel``) reads each row's blocks where they lie.
Without a compiler (or on a GPU) the rows' blocks are gathered into a dense tensor and fed to
``grouped_attention``: the same numbers, at the price of copying the cache once per layer.
``DECODA_PAGED_KERNEL=torch`` forces the fallback (the tests compare the two).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
from pathlib import Path

import torch

from decoding.kv.native_kernel import build_and_load, cpu_id

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("paged_decode.c")
# -march=native unless an image builder names a portable target (the Dockerfile: x86-64-v3)
MARCH = os.environ.get("DECODA_KERNEL_MARCH", "native")
FLAGS = ["-O3", f"-march={MARCH}", "-fopenmp", "-fPIC", "-shared"]

_library: list[ctypes.CDLL | None] = []  # loaded once per process; [None] when unavailable


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
    native = plain and keys.device.type == "cpu" and keys.dtype in (torch.float32, torch.bfloat16)
    library = _native() if native else None
    if library is None:
        return _gathered(query, keys, values, tables, lengths, firsts, scaling, softcap, sinks)
    rows, num_heads, head_dim = query.shape
    q = query.float().contiguous()
    out = torch.empty((rows, num_heads, head_dim), dtype=torch.float32, device=query.device)
    status = library.paged_decode(
        q.data_ptr(), keys.data_ptr(), values.data_ptr(), tables.data_ptr(), lengths.data_ptr(),
        firsts.data_ptr(), out.data_ptr(), rows, num_heads, keys.shape[1], keys.shape[2], head_dim,
        tables.shape[1], ctypes.c_float(scaling), int(keys.dtype == torch.bfloat16), torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise RuntimeError("paged attention could not start its threads")
    return out.to(query.dtype)


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
    supported = (torch.float32, torch.bfloat16)
    tensors = (query, key, value, keys, values)
    if (
        query.device.type != "cpu"
        or any(t.dtype not in supported or t.stride(-1) != 1 for t in tensors)
        or key.dtype != value.dtype
        or keys.dtype != values.dtype
        or not (keys.is_contiguous() and values.is_contiguous())
        or keys.shape[-1] != values.shape[-1]
        or key.shape[-1] != keys.shape[-1]
        or key.shape[0] != keys.shape[1]
        or tables.shape[0] == 0
    ):
        return None
    library = _native()
    if library is None:
        return None
    rows, (num_heads, _, head_dim) = tables.shape[0], query.shape
    out = torch.empty((rows, num_heads, head_dim), dtype=query.dtype, device=query.device)
    status = library.paged_write_decode(
        query.data_ptr(), query.stride(0), query.stride(1), int(query.dtype == torch.bfloat16),
        key.data_ptr(), key.stride(0), key.stride(1), value.data_ptr(), value.stride(0), value.stride(1),
        int(key.dtype == torch.bfloat16), keys.data_ptr(), values.data_ptr(), int(keys.dtype == torch.bfloat16),
        token_blocks.data_ptr(), token_offsets.data_ptr(), token_blocks.shape[0],
        tables.data_ptr(), lengths.data_ptr(), firsts.data_ptr(), rows,
        out.data_ptr(), int(out.dtype == torch.bfloat16), num_heads, keys.shape[1], keys.shape[2], head_dim,
        tables.shape[1], ctypes.c_float(scaling), torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise RuntimeError("paged attention could not allocate its scratch memory")
    return out


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
    return _native() is not None


def _native() -> ctypes.CDLL | None:
    if not _library:
        _library.append(None if os.environ.get("DECODA_PAGED_KERNEL") == "torch" else _load())
    return _library[0]


def _load() -> ctypes.CDLL | None:
    machine = cpu_id() if MARCH == "native" else MARCH.encode()
    tag = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode() + machine).hexdigest()[:16]
    library = build_and_load(SOURCE, FLAGS, f"paged_decode-{tag}.so")
    if library is None:
        logger.warning("paged attention kernel unavailable: decode attention gathers the cache (slower)")
        return None
    library.paged_decode.restype = ctypes.c_int
    library.paged_decode.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_int64] * 6 + [
        ctypes.c_float, ctypes.c_int, ctypes.c_int,
    ]  # fmt: skip
    pointer, size, flag = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    library.paged_write_decode.restype = ctypes.c_int
    library.paged_write_decode.argtypes = [
        pointer, size, size, flag,  # query and its head/token strides
        pointer, size, size, pointer, size, size, flag,  # new K, new V
        pointer, pointer, flag,  # the pool
        pointer, pointer, size,  # where each token goes
        pointer, pointer, pointer, size,  # the decode rows' tables, lengths, firsts
        pointer, flag, size, size, size, size, size, ctypes.c_float, flag,
    ]  # fmt: skip
    return library



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
