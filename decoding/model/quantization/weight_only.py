"""``--quantization int8`` / ``int4``: quantize a float model's weights once, at load (weight-only).

* int8: symmetric, one scale per output channel (``s = max|w| / 127``), run by the int8 kernel.
* int4: asymmetric min/max per 32-column group (``w ≈ s*q + min``, ``q`` in 0..15, ``s`` and the
  minimum in float), the layout Q4_1 has, run by the int4 kernel. 32 columns keep the error of a
  group small at one extra bit a weight (a bfloat16 scale and zero per 32 weights).

Activations stay as they are (no activation quantization): every matmul multiplies bfloat16
activations by the dequantized weights inside the kernel, accumulating in float32.
"""

from __future__ import annotations

import torch

from decoding.model.quantization.affine import AffineCodes
from decoding.model.quantization.int8_matrix import Int8Matrix

INT4_GROUP = 32


def quantize_int8(weight: torch.Tensor) -> Int8Matrix:
    """Per output channel, symmetric: ``w ≈ s[n] * q[n, k]`` with ``q`` in [-127, 127]."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # [out_features]
    codes = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return Int8Matrix(codes, scale)


def quantize_int4(weight: torch.Tensor, group_size: int = INT4_GROUP) -> AffineCodes:
    """Per ``group_size`` input columns, asymmetric min/max: ``w ≈ s * q + min`` with ``q`` in [0, 15]."""
    w = weight.detach().float()
    out_features, in_features = w.shape
    if in_features % group_size:
        raise ValueError(f"int4 needs in_features divisible by {group_size}, got {in_features}")
    groups = w.reshape(out_features, -1, group_size)
    low, high = groups.amin(dim=2), groups.amax(dim=2)  # [out, groups]
    # the kernel sees a bfloat16 scale, so codes are chosen against that one
    scale = ((high - low) / 15.0).clamp(min=1e-12).to(torch.bfloat16).float()
    codes = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.uint8)
    return AffineCodes(codes.reshape(out_features, in_features), scale, low, None, group_size, 4)
