"""CPU linears whose weights are packed once into oneDNN's blocked layout.

Every decode step is a handful of skinny matrix products (one row per running sequence), and
PyTorch's default CPU BLAS runs those far below what the machine can do: it re-reads and
re-blocks the plain ``[out, in]`` weight on every call. oneDNN can block a weight once, at load
time (``torch.ops.mkldnn._reorder_linear_weight``, what inductor's freezing pass does for CPU
linears), and then multiply any number of rows against it. Measured on this project's 2-core
AMD EPYC over SmolLM2-135M's 210 linear shapes plus its 49152x576 LM head, float32
(``.venv/bin/python loadtests/bench_linear_layouts.py``):

    tokens   F.linear(x, W)   x @ W_t   (W @ x.T).T   oneDNN packed
    1          49 ms          42 ms      56 ms          26 ms
    4          68 ms          86 ms      42 ms          36 ms
    16         75 ms          82 ms      80 ms          44 ms
    64        158 ms         154 ms     225 ms          97 ms
    512       912 ms        1162 ms    1165 ms         701 ms

So one packed copy serves every batch size, prefill chunks included: decode steps with 16 rows
run their linears in about half the time. The packed copy replaces the transposed copies an
earlier layout kept; ``weight`` stays (tied embeddings, state dicts and hooks still see it).
Results equal ``F.linear`` up to float reassociation (the HF parity tests run through this
layer). bfloat16 weights pack the same way and use the CPU's bf16 dot-product instructions.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)

PACKING_BATCH_HINT = 64  # oneDNN picks its blocking for this many rows; measured best from 1 to 512


class PackedLinear(nn.Module):
    """Drop-in for ``nn.Linear`` (same ``weight``/``bias``) multiplying by a oneDNN-packed copy."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        # an opaque mkldnn tensor, not a parameter: it is a cache of ``weight``, never trained or saved
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), PACKING_BATCH_HINT)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(hidden, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


def can_pack(model: nn.Module) -> bool:
    """Packing needs a CPU model in float32 or bfloat16 and a PyTorch built with oneDNN."""
    first = next(model.parameters())
    return (
        first.device.type == "cpu"
        and first.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
    )


def pack_linears(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` of a CPU model in place; returns how many were replaced."""
    if not can_pack(model):
        return 0
    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, PackedLinear(child))
                replaced += 1
    logger.debug("packed %d linears for oneDNN", replaced)
    return replaced
