"""The batched low-rank product: each packed token's ``x @ A[i] @ B[i] * scale[i]`` for its adapter ``i``.

A step packs the tokens of every row into one sequence; rows may use different adapters (or none:
index 0, the zero adapter). The base linear runs once for the whole sequence; this adds each token's
LoRA delta. Three phrasings of the same sum were measured (``python -m loadtests.bench_lora_product``,
SmolLM2-135M's seven projections x 30 layers, 4 resident adapters of rank 16, float32, 2 threads):

* ``gathered`` (BGMV as in Punica/vLLM): ``bmm(x[:, None], A[idx]) @ B[idx]``: one gather of each
  token's matrices and two batched products;
* ``grouped``: one ``index_select`` / ``mm`` / ``index_add_`` per adapter present in the step (a loop
  over adapters, never over rows);
* ``stacked``: one product with every resident adapter's ``A`` side by side (``[in, slots*r]``), the
  columns of other adapters zeroed by a one-hot mask that also carries the scale, and one product
  with the ``B``s stacked (``[slots*r, out]``): two dense matmuls, no gather, no Python loop.

Best ms for one step's 210 deltas (4 adapters + base, rank 16, float32, 2 threads, a shared 2-core
machine whose neighbours make single figures swing by 2x; the order held in every run):

    tokens   base linears   stacked   gathered   grouped   one adapter
    1            74           23         15         24         12
    4            96           25         15         64          3
    16          130           36         55         78         10
    64          590           88        180        414         60
    256        1994          462       9784       1628        129

``gathered`` copies every token's matrices (``[T, in, r]``): it loses from 16 tokens on; ``grouped``
pays an ``index_select``/``index_add_`` per adapter. ``stacked`` is kept for steps that mix adapters
(or adapters and the base), and ``single`` (two products, no mask) for steps whose tokens all use one
adapter. On a CPU both run where the base linears run: oneDNN (``add_stacked_onednn``), except a
one-adapter step of at most a few tokens, where ``torch.mm`` costs ~5 us a linear against oneDNN's
~20 (``bank.SINGLE_MM_TOKENS``).
"""

from __future__ import annotations

import torch


def add_stacked(
    out: torch.Tensor, x: torch.Tensor, a_cat: torch.Tensor, b_cat: torch.Tensor, mask: torch.Tensor, rank: int
) -> torch.Tensor:
    """``out`` ``[T, out]`` plus every token's delta (a new tensor: a base linear's output may be a view
    a sibling linear still reads, ``quantization/sibling_products``). ``x`` ``[T, in]``; ``a_cat``
    ``[in, S*r]``; ``b_cat`` ``[S*r, out]``; ``mask`` ``[T, S, 1]`` (each token's adapter's scale in its
    slot, zeros elsewhere)."""
    tokens, slots = mask.shape[:2]
    down = (x @ a_cat).view(tokens, slots, rank).mul_(mask)  # [T, S, r]
    return torch.addmm(out, down.view(tokens, slots * rank), b_cat)


def add_single(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """``out + x @ a @ b * scale``: a step whose tokens all use one adapter (one client) needs no mask."""
    return torch.addmm(out, x @ a, b, alpha=scale)


def gathered_delta(
    x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor, index: torch.Tensor
) -> torch.Tensor:
    """``a`` ``[S, in, r]``, ``b`` ``[S, r, out]``, ``scale`` ``[S]``, ``index`` ``[T]`` → ``[T, out]``."""
    down = torch.bmm(x.unsqueeze(1), a.index_select(0, index))  # [T, 1, r]
    up = torch.bmm(down, b.index_select(0, index)).squeeze(1)  # [T, out]
    return up * scale.index_select(0, index).unsqueeze(1)


def grouped_delta(
    x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor, index: torch.Tensor,
    present: list[int],
) -> torch.Tensor:  # fmt: skip
    """The same sum, one product pair per adapter in ``present`` (the non-zero indices in ``index``)."""
    out = x.new_zeros(x.shape[0], b.shape[-1])
    for adapter in present:
        rows = (index == adapter).nonzero().squeeze(1)
        part = (x.index_select(0, rows) @ a[adapter]) @ b[adapter]
        out.index_add_(0, rows, part * scale[adapter])
    return out


def uses_onednn(device: torch.device, dtype: torch.dtype) -> bool:
    """On a CPU the products run through oneDNN, as the packed base linears do (``model/packed_linear``):
    ``torch.mm`` there is MKL's, whose own thread team and the OpenMP one of every other op of the step
    take turns on the cores. Measured on this project's 2-core machine, a 16-row step over 4 adapters:
    5.6 s with ``mm``, 0.22 s with MKL held to one thread; oneDNN shares the step's team."""
    return device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and torch.backends.mkldnn.is_available()


def pack_onednn(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[out, in]`` in oneDNN's blocked layout (rewritten when a slot's adapter changes)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 64)


def add_stacked_onednn(
    out: torch.Tensor, x: torch.Tensor, a_packed: torch.Tensor, b_packed: torch.Tensor, mask: torch.Tensor, rank: int
) -> torch.Tensor:
    """``add_stacked`` through oneDNN: ``a_packed`` is ``A^T`` ``[S*r, in]``, ``b_packed`` ``B^T`` ``[out, S*r]``."""
    tokens, slots = mask.shape[:2]
    down = torch.ops.mkldnn._linear_pointwise(x, a_packed, None, "none", [], "")  # [T, S*r]
    down = down.view(tokens, slots, rank).mul_(mask).view(tokens, slots * rank)
    return out + torch.ops.mkldnn._linear_pointwise(down, b_packed, None, "none", [], "")
