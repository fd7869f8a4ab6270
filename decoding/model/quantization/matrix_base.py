"""Why a low-bit matrix is an ``nn.Module`` whose tensors are (non-persistent) buffers.

Under ``--compile`` each decoder layer is compiled on its own and all layers share one compiled
graph (``decoding.model.compile``). That sharing needs a layer's weights to reach the graph as
inputs, which the compiler does for a module's parameters and buffers; a tensor kept as a plain
attribute of a plain object would be baked into the graph as a constant, forcing a separate
compile per layer. Buffers are also what ``model.to(device)`` moves.
"""

from __future__ import annotations

import torch
from torch import nn


class MatrixModule(nn.Module):
    """Base of the kernel-backed matrices; ``keep`` registers a tensor (or None) as a buffer."""

    owns_its_tensors = True  # built from codes, never views of a checkpoint's file mapping
    input_dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,)  # PyTorch's low-bit CPU kernels vectorize bfloat16

    def keep(self, name: str, tensor: torch.Tensor | None) -> None:
        self.register_buffer(name, tensor, persistent=False)
