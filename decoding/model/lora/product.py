"""The batched low-rank product: each packed token's ``x @ A[i] @ B[i] * scale[i]`` for its adapter ``i``.

A step packs the tokens of every row into one sequence; rows may use different adapters (or none:
the base). The base linear runs once for the whole sequence; this adds each token's LoRA delta into
its output, in place (the base output is a fresh tensor of the wrapped linear's own: ``bank``).
Phrasings of the same sum measured (``python -m loadtests.bench_lora_product``, SmolLM2-135M's seven
projections x 30 layers, 4 resident adapters of rank 16, float32):

* ``gathered`` (BGMV as in Punica/vLLM): ``bmm(x[:, None], A[idx]) @ B[idx]``: one gather of each
  token's matrices and two batched products; copies ``[T, in, r]``: loses from 16 tokens on;
* ``grouped`` as a loop: one ``index_select`` / ``mm`` / ``index_add_`` per adapter present;
* ``stacked``: one product with the resident adapters' ``A`` side by side (``[in, n*r]``), the columns
  of other adapters zeroed by a one-hot mask that also carries the scale, and one product with the
  ``B``s stacked (``[n*r, out]``): two dense matmuls, no gather, no Python loop; it computes every
  token against every adapter in the step's range (``n`` of them);
* ``padded``: the tokens gathered by adapter into ``[n, m, in]`` (``m`` the most tokens one adapter
  has, shorter groups padded with rows the mask zeroes), two ``bmm`` and one ``index_add_``: each
  token against its own adapter only, at the price of a gather and a scatter.

Best ms for one step's 210 deltas, without the zero adapter in the stack (a shared 2-core machine,
its neighbours stopped while timing; 1 thread / 2 threads):

    tokens                     stacked       padded
    16, spread over 4          13.1 / 10.0   13.8 / 12.8
    64, spread over 4          21.9 / 17.9   20.0 / 16.5
    320, 4 runs of 80          96.0 / 64.5   65.7 / 43.0
    21, one adapter + 1 base   13.2 / 10.0   19.9 / 20.7

So a step whose tokens all use one adapter takes ``single`` (two products, no mask), a mixed step
``stacked`` over the adapters it uses, and a long one whose adapters' shares are balanced (at most
half of the stacked rows when padded) ``padded`` (``bank.GROUPED_TOKENS``). The zero adapter is not
in the stack: a base token's mask row is all zeros.

The native kernel (``native.add_deltas``, ``low_rank.cpp``: one call, each adapter's ``A`` and ``B``
read once for its own tokens, a base token skipped) against them, same bench, session of
2026-11-27 (machine otherwise idle; 1 thread / 2 threads, ms):

    tokens                     stacked       padded        1 adapter    native
    1, adapter 1                7.3 / 4.9    11.6 / 9.9    2.2 / 2.9    1.4 / 1.6
    4, spread over 4            9.6 / 6.4    12.2 / 11.5         -       3.1 / 3.3
    16, spread over 4          13.2 / 8.9    14.3 / 14.7         -       9.2 / 5.2
    64, spread over 4          21.6 / 24.8   23.1 / 19.7         -      18.5 / 12.1
    320, 4 runs of 80          94.6 / 74.8   81.8 / 53.1         -      70.1 / 46.6
    21, one adapter + 1 base   13.6 / 12.1   21.5 / 19.0         -       5.1 / 6.6
    64, one adapter                 -             -        6.7 / 8.4   13.2 / 11.7

So where it runs (float32 on a CPU) every mixed step and a one-adapter step of up to 16 tokens take
it (``bank.NATIVE_SINGLE_TOKENS``); a longer one-adapter chunk keeps ``single``, whose blocking wins.
These figures are warm: in the engine the matrices come from memory between base weights, where a
one-token step's 210 calls took ~2.4 ms of one thread (SmolLM2's 19.5 MB of rank-16 float32 ``A``
and ``B`` at ~10 GB/s, plus ~2.5 us of dispatch a call) against ~5.3 ms through ``add_single``.

All of them run through ``torch.mm``/``bmm`` on a CPU too. oneDNN (``add_stacked_onednn``, what the
packed base linears use) was the earlier choice, against MKL's thread team fighting OpenMP's (a
16-row step 5.6 s with ``mm`` in torch 2.5); measured again in the engine (torch 2.13, this machine,
16 rows over 4 adapters, median decode step): ``mm`` 105 ms, oneDNN 121 ms at 2 threads, 13 against
32 ms of products at 1 thread; no slowdown of ``mm`` at either count. It stays for comparison
(``loadtests/bench_lora --product onednn``).
"""

from __future__ import annotations

import torch


def add_single(out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    """``out += x @ a @ b * scale`` in place (returned): a step whose tokens all use one adapter (one
    client) needs no mask."""
    return out.addmm_(x @ a, b, alpha=scale)


def add_stacked(
    out: torch.Tensor, x: torch.Tensor, a_cat: torch.Tensor, b_cat: torch.Tensor, mask: torch.Tensor, rank: int
) -> torch.Tensor:
    """``out`` ``[T, out]`` plus every token's delta, in place (returned). ``x`` ``[T, in]``; ``a_cat``
    ``[in, n*r]``; ``b_cat`` ``[n*r, out]``; ``mask`` ``[T, n, 1]`` (each token's adapter's scale in its
    column, zeros elsewhere: all zeros for a base token)."""
    tokens, adapters = mask.shape[:2]
    down = (x @ a_cat).view(tokens, adapters, rank).mul_(mask)  # [T, n, r]
    return out.addmm_(down.view(tokens, adapters * rank), b_cat)


def add_padded(
    out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, gather: torch.Tensor, mask: torch.Tensor,
    rows: torch.Tensor, tokens: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """``out`` plus each token's delta against its own adapter only, in place (returned). ``a``
    ``[n, in, r]``, ``b`` ``[n, r, out]``; ``gather`` ``[n*m]`` the token of each padded row (padding
    repeats one); ``mask`` ``[n, m, 1]`` the row's scale, 0 for padding; ``rows`` the padded rows that
    hold a token and ``tokens`` which token each holds (every token at most once: no two additions
    into one row)."""
    adapters, width = mask.shape[:2]
    down = torch.bmm(x.index_select(0, gather).view(adapters, width, -1), a).mul_(mask)  # [n, m, r]
    up = torch.bmm(down, b).view(adapters * width, -1)  # [n*m, out]
    return out.index_add_(0, tokens, up.index_select(0, rows))


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
    """Whether oneDNN can run the stacked product here (a CPU, float32 or bfloat16): only on request
    (``LoraBank.use_product``), ``torch.mm`` measured faster (the module's docstring)."""
    return device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and torch.backends.mkldnn.is_available()


def pack_onednn(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[out, in]`` in oneDNN's blocked layout (rewritten when a slot's adapter changes)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 64)


def add_stacked_onednn(
    out: torch.Tensor, x: torch.Tensor, a_packed: torch.Tensor, b_packed: torch.Tensor, mask: torch.Tensor, rank: int
) -> torch.Tensor:
    """``add_stacked`` through oneDNN: ``a_packed`` is ``A^T`` ``[n*r, in]``, ``b_packed`` ``B^T`` ``[out, n*r]``."""
    tokens, adapters = mask.shape[:2]
    down = torch.ops.mkldnn._linear_pointwise(x, a_packed, None, "none", [], "")  # [T, n*r]
    down = down.view(tokens, adapters, rank).mul_(mask).view(tokens, adapters * rank)
    return out.add_(torch.ops.mkldnn._linear_pointwise(down, b_packed, None, "none", [], ""))
