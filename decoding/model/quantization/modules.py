"""``nn.Module`` faces of the low-bit matrices: drop-ins for ``nn.Linear`` and ``nn.Embedding``.

The rest of the model (norms, attention, residual stream, logits) keeps the model's dtype; a
linear hands its input to the kernel in a dtype the kernel takes (bfloat16 for PyTorch's int4 and
int8 kernels, the model's own for the native block kernel) and returns its output in the model's
dtype. A tied embedding and LM head hold the same matrix object, so a weight that serves both
exists once in memory.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn


class LowBitMatrix(Protocol):
    out_features: int
    in_features: int
    input_dtypes: tuple[torch.dtype, ...]  # what matmul takes (and returns); others go in as bfloat16

    def matmul(self, x: torch.Tensor) -> torch.Tensor: ...  # [rows, in] → [rows, out], in x's dtype

    def nbytes(self) -> int: ...


class LookupMatrix(LowBitMatrix, Protocol):
    def rows(self, ids: torch.Tensor) -> torch.Tensor: ...  # [len(ids), in] float32


class QuantizedLinear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` held only as low-bit codes and scales."""

    def __init__(self, matrix: LowBitMatrix, bias: torch.Tensor | None, kind: str) -> None:
        super().__init__()
        self.matrix = matrix
        self.in_features = matrix.in_features
        self.out_features = matrix.out_features
        self.kind = kind  # e.g. "gguf Q4_1", "int8", for the module's repr and the load log
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, self.in_features)
        if flat.dtype not in self.matrix.input_dtypes:
            flat = flat.to(torch.bfloat16)
        out = self.matrix.matmul(flat.contiguous()).to(hidden.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*hidden.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weights={self.kind}"


class QuantizedEmbedding(nn.Module):
    """Token embeddings gathered (and dequantized exactly) from a low-bit matrix's rows.

    ``embed_scale`` carries Gemma's ``sqrt(hidden_size)`` multiplier (``Gemma3TextScaledWordEmbedding``),
    applied in the model's dtype as transformers does.
    """

    def __init__(self, matrix: LookupMatrix, dtype: torch.dtype, kind: str, embed_scale: float | None = None) -> None:
        super().__init__()
        self.matrix = matrix
        self.num_embeddings = matrix.out_features
        self.embedding_dim = matrix.in_features
        self.dtype = dtype
        self.kind = kind
        self.embed_scale = embed_scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = self.matrix.rows(input_ids.reshape(-1)).to(self.dtype)
        if self.embed_scale is not None:
            rows = rows * torch.tensor(self.embed_scale, dtype=self.dtype, device=rows.device)
        return rows.reshape(*input_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, weights={self.kind}"
