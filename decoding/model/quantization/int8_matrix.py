"""A weight in int8 with one scale per output channel, multiplied by PyTorch's CPU int8 kernel.

``torch.ops.aten._weight_int8pack_mm(x, q, s)`` computes ``x @ (q * s[:, None]).T`` over a plain
``[out, in]`` int8 matrix; vectorized for bfloat16 activations (float32 ones run a scalar loop), so
activations and ``s`` are bfloat16. The matrix stays plain row-major, so a tied embedding gathers
its rows from the very same tensor (times the exact float32 scale): one copy serves both.
"""

from __future__ import annotations

import torch

from decoding.model.quantization.matrix_base import MatrixModule

ACT_DTYPE = torch.bfloat16


class Int8Matrix(MatrixModule):
    """``matmul(x) = x @ (codes * scale).T``; ``rows(ids)`` for a tied embedding."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__()
        self.keep("codes", codes.to(torch.int8).contiguous())  # [out_features, in_features]
        self.keep("exact_scale", scale.float().contiguous())  # [out_features]
        self.keep("scale", scale.to(ACT_DTYPE).contiguous())
        self.out_features, self.in_features = self.codes.shape

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[rows, in_features]`` bfloat16 → ``[rows, out_features]`` bfloat16."""
        return self.forward(x)  # the kernel call itself: no module-call machinery on the per-token path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x, self.codes, self.scale)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.codes[ids].float() * self.exact_scale[ids, None]

    def dequantize(self) -> torch.Tensor:
        return self.codes.float() * self.exact_scale[:, None]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.exact_scale, self.scale))
