"""Float32 linears on CPU that pick the fastest BLAS formulation for the number of tokens.

Every decode step is a handful of skinny matrix products whose speed, on PyTorch's CPU BLAS,
depends far more on how the product is phrased than on its size. Measured on this project's
2-core AMD EPYC over SmolLM2-135M's 211 linear shapes plus its 49152x576 LM head
(``/tmp``-free reproduction: ``loadtests/bench_linear_layouts.py``):

    tokens   F.linear(x, W)   x @ W_t   (W @ x.T).T
    1          36 ms          31 ms      37 ms
    2          63 ms          46 ms      27 ms
    4          68 ms          72 ms      28 ms
    8          60 ms          73 ms      48 ms
    16         74 ms          84 ms      62 ms
    128       261 ms           -        273 ms

So a single token multiplies by a transposed copy ``W_t`` (contiguous ``[in, out]``), 2 to 64
tokens compute ``W @ x.T`` and transpose the small result back, and larger prefill chunks use the
plain ``F.linear``. Keeping both layouts costs one extra copy of the weights (538 MB for
SmolLM2 in float32); it buys ~15% at batch 1 and up to 2x per decode step at 2-16 rows. Results
equal ``F.linear`` up to float reassociation (the greedy parity tests run through this layer).
bfloat16 is left alone: its transposed product is 20x slower here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SKINNY_MAX_TOKENS = 64


class CpuLinear(nn.Module):
    """Drop-in for ``nn.Linear`` (same ``weight``/``bias``) with a transposed copy for one token."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.weight_t = nn.Parameter(linear.weight.detach().t().contiguous(), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, self.in_features)  # [num_tokens, in_features]
        num_tokens = flat.shape[0]
        if num_tokens == 1:
            out = flat @ self.weight_t
        elif num_tokens <= SKINNY_MAX_TOKENS:
            out = (self.weight @ flat.t()).t().contiguous()
        else:
            return F.linear(hidden, self.weight, self.bias)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*hidden.shape[:-1], self.out_features)


def transpose_linears(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` of a float32 CPU model in place; returns how many were replaced."""
    first = next(model.parameters())
    if first.device.type != "cpu" or first.dtype != torch.float32:
        return 0
    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, CpuLinear(child))
                replaced += 1
    return replaced
