"""CPU linears whose weights are packed once into oneDNN's blocked layout.

Every decode step is a handful of skinny matrix products (one row per running sequence), and
PyTorch's default CPU BLAS runs those far below what the machine can do: it re-reads and
re-blocks the plain ``[out, in]`` weight on every call. oneDNN can block a weight once, at load
time (``torch.ops.mkldnn._reorder_linear_weight``, what inductor's freezing pass does for CPU
linears), and then multiply any number of rows against it. Measured on this project's 2-core
AMD EPYC over SmolLM2-135M's 210 linear shapes plus its 49152x576 LM head, float32
(``.venv/bin/python -m loadtests.bench_linear_layouts``):

    tokens   F.linear(x, W)   x @ W_t   (W @ x.T).T   oneDNN packed
    1          49 ms          42 ms      56 ms          26 ms
    4          68 ms          86 ms      42 ms          36 ms
    16         75 ms          82 ms      80 ms          44 ms
    64        158 ms         154 ms     225 ms          97 ms
    512       912 ms        1162 ms    1165 ms         701 ms

So one packed copy serves every batch size, prefill chunks included: decode steps with 16 rows
run their linears in about half the time. The packed copy is the only copy: the plain ``weight``
is dropped once packed (it doubled the resident weights: 424 MB more for SmolLM2 in float32). A
linear whose weight another module also uses (an LM head tied to the embedding) is not packed: the
embedding needs the plain rows, and a second, packed copy of the largest matrix would cost 113 MB
more in float32. In float32 such a linear multiplies as ``W @ x.T`` or ``F.linear``, whichever this
CPU runs faster at the step's row count (``SharedWeightLinear``, timed at load): on the EPYC the
49152x576 head, 2 threads (``python -m loadtests.bench_linear_layouts``, its last table), took 9.6 ms
with ``F.linear`` at 1 row and 2.8 ms as ``W @ x.T`` with the row doubled (MKL's one-column product is
as slow as ``F.linear``), 16 rows 18.7 vs 14.7 ms; on a Xeon with AVX-512 it is the other way round
(2.4 vs 8.7 ms at 1 row). In bfloat16 ``F.linear`` is already as fast (3.4 ms at one row), so it stays.
Results equal ``F.linear`` up to float reassociation (the HF parity tests run through this
layer). bfloat16 weights pack the same way; they reach the CPU's bf16 dot-product instructions
only where it has them (avx512_bf16 / AMX; elsewhere oneDNN converts bf16 to float32 inside the
kernel).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import time

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

PACKING_BATCH_HINT = 64  # oneDNN picks its blocking for this many rows; measured best from 1 to 512


class PackedLinear(nn.Module):
    """Drop-in for ``nn.Linear`` (same ``bias``) multiplying by a oneDNN-packed weight, its only copy."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.bias = linear.bias
        # an opaque mkldnn tensor, not a parameter: inference only, never trained or saved
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACKING_BATCH_HINT)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(hidden, self.packed, self.bias, "none", [], "")

    @property
    def weight(self) -> torch.Tensor:
        """The packed weight: modeling code that reads a linear's ``weight`` for its dtype only (T5's
        feed-forward casts its input to ``wo.weight.dtype``) finds the served one."""
        return self.packed

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


class SharedWeightLinear(nn.Module):
    """Drop-in for a float32 ``nn.Linear`` whose weight another module holds too (a tied LM head),
    multiplied with the same weight tensor, no copy, in whichever of two forms this CPU runs faster.

    MKL's skinny products are fast in one form and slow in the other, and which is which depends on
    the CPU: over Whisper base's tied head (51,865 x 512), two threads, one row, ``W @ x.T`` with the
    row doubled took 2.8 ms on the AMD EPYC this layer was written on (``F.linear`` 9.6 ms) and 6.4 ms
    on a Xeon with AVX-512, where ``F.linear`` took 2.2 ms. So a large weight times both forms once
    per power-of-two row count at load (``calibrate``) and keeps the faster one per count: a decode
    step's head is the largest single read of a small model's step."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.row_form: dict[int, bool] = {}  # row bucket -> F.linear (True) or W @ x.T (False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, self.in_features)
        if self.row_form.get(_bucket(flat.shape[0]), False):
            return F.linear(flat, self.weight, self.bias).reshape(*hidden.shape[:-1], self.out_features)
        out = self._columns(flat)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*hidden.shape[:-1], self.out_features)

    def _columns(self, flat: torch.Tensor) -> torch.Tensor:
        rows = flat.shape[0]
        if rows == 1:  # a one-column product takes MKL's slow path again: two columns, one kept
            flat = flat.repeat(2, 1)
        return (self.weight @ flat.T).T[:rows].contiguous()

    @torch.inference_mode()
    def calibrate(self) -> None:
        """Time both forms at each of ``BUCKETS`` rows on this CPU and thread count, taking
        turns, and keep ``F.linear`` where it is clearly faster (``ROW_FORM_MARGIN``: near-equal forms
        keep the one this layer has always used, so runs on one machine rarely differ). Weights under
        ``CALIBRATE_BYTES`` are not timed: their product is not what a step waits on."""
        if self.weight.numel() * self.weight.element_size() < CALIBRATE_BYTES:
            return
        device = self.weight.device
        seeded = torch.Generator(device=device).manual_seed(0)
        for bucket in BUCKETS:
            x = torch.randn(bucket, self.in_features, dtype=self.weight.dtype, device=device, generator=seeded)
            best = {True: float("inf"), False: float("inf")}
            for _ in range(CALIBRATE_ROUNDS):
                for row_form in (True, False):
                    started = time.perf_counter()
                    F.linear(x, self.weight) if row_form else self._columns(x)
                    best[row_form] = min(best[row_form], time.perf_counter() - started)
            self.row_form[bucket] = best[True] < ROW_FORM_MARGIN * best[False]
        chosen = [bucket for bucket in BUCKETS if self.row_form[bucket]]
        logger.info("tied %dx%d linear, %d threads: F.linear at %s rows, W @ x.T at the rest (timed)",
                    self.out_features, self.in_features, torch.get_num_threads(),
                    ", ".join(map(str, chosen)) or "no")  # fmt: skip

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, shared weight"


CALIBRATE_BYTES = 16 * 2**20  # a head this large is a tenth or more of a small model's step
BUCKETS = (1, 2, 4, 8, 16, 32)  # row counts timed; more rows take the last one's form
CALIBRATE_ROUNDS = 2  # each form's best of two, taking turns (a 670 MB head takes ~70 ms a call)
ROW_FORM_MARGIN = 0.85  # F.linear must take under 85% of W @ x.T's time to be chosen


def _bucket(rows: int) -> int:
    """The timed row count a product of ``rows`` rows takes its form from: the next power of two, at
    most the largest timed."""
    return min(BUCKETS[-1], 1 << max(0, rows - 1).bit_length())


def can_pack(model: nn.Module) -> bool:
    """Packing needs a CPU model in float32 or bfloat16 and a PyTorch built with oneDNN; bfloat16 also
    needs a CPU whose oneDNN takes bf16 weights (AVX-512 BW/VL/DQ or AVX-NE-CONVERT): on an AVX2-only
    CPU the reorder raises, so its bfloat16 linears stay plain ``F.linear``."""
    first = next(model.parameters())
    if first.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if first.dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return first.dtype == torch.float32


def pack_linears(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` of a CPU model whose weight it owns alone, and in float32 those
    whose weight is shared (``SharedWeightLinear``); returns how many were packed."""
    if not can_pack(model):
        return 0
    shared = _weights_used_elsewhere(model)
    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is not nn.Linear:
                continue
            if id(child.weight) not in shared:
                setattr(module, name, PackedLinear(child))
                replaced += 1
            elif child.weight.dtype == torch.float32:
                shared_linear = SharedWeightLinear(child)
                shared_linear.calibrate()
                setattr(module, name, shared_linear)
    own_remaining_tensors(model)
    logger.debug("packed %d linears for oneDNN", replaced)
    return replaced


def own_remaining_tensors(model: nn.Module) -> None:
    """Copy the parameters and buffers still in the model out of the checkpoint's file mapping.

    transformers 5 loads safetensors zero-copy: every tensor is a view into one private mapping of
    the whole file, and one surviving view (a norm weight, the embedding) keeps all of it mapped,
    with every page ever read still counted as resident. Once the linears are packed (or
    quantized) the originals are gone, so the few tensors left are copied and the mapping is freed
    (SmolLM2 in float32: 1.18 GB resident after packing without this, ~0.8 GB with it).
    """
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data.clone()
        for module in model.modules():
            if getattr(module, "owns_its_tensors", False):  # low-bit matrices: built, not mapped
                continue
            for name, buffer in list(module._buffers.items()):
                if buffer is not None:
                    module._buffers[name] = buffer.clone()
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc keeps freed heap pages otherwise
    except (OSError, AttributeError):
        pass


def _weights_used_elsewhere(model: nn.Module) -> set[int]:
    """ids of weights that a module other than a plain ``nn.Linear`` also holds (tied embeddings)."""
    return {
        id(param)
        for module in model.modules()
        if type(module) is not nn.Linear
        for param in module.parameters(recurse=False)
    }
