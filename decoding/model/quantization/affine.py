"""The one form every low-bit weight takes here: integer codes with a scale and offset per group.

``w[n, k] = scale[n, g] * code[n, k] + offset[n, g]`` with ``g = k // group_size``. GGUF's block
types (``gguf_blocks``) and the ``int4`` quantizer (``weight_only``) each produce this form, and
``int4_matrix`` packs it for the CPU kernel, so a new block type only needs a decoder.

Symmetric types (GGUF's ``Q4_0``, ``Q5_0``, ``Q8_0``, ``Q6_K``) have ``offset = -zero_code * scale``
exactly; they record ``zero_code`` instead of an offset tensor, which lets the packer express the
offset as a power-of-two multiple of the (rounded) scale, so no second rounding is added.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AffineCodes:
    codes: torch.Tensor  # [out_features, in_features] uint8, values in [0, 2**bits)
    scale: torch.Tensor  # [out_features, in_features // group_size] float32 (exact)
    offset: torch.Tensor | None  # same shape as scale, float32; None when symmetric
    zero_code: int | None  # symmetric types: offset == -zero_code * scale
    group_size: int  # 16, 32, 64, ... input columns sharing one scale
    bits: int  # largest code < 2**bits

    @property
    def shape(self) -> tuple[int, int]:
        return (self.codes.shape[0], self.codes.shape[1])

    def offsets(self) -> torch.Tensor:
        """The offset per group as a float32 tensor, symmetric or not."""
        if self.offset is not None:
            return self.offset
        assert self.zero_code is not None
        return -float(self.zero_code) * self.scale

    def dequantize(self) -> torch.Tensor:
        """The exact float32 weights ``[out_features, in_features]`` (the reference the kernels are tested against)."""
        expand = self.group_size
        scale = self.scale.repeat_interleave(expand, dim=1)
        offset = self.offsets().repeat_interleave(expand, dim=1)
        return scale * self.codes.float() + offset

    def take(self, ids: torch.Tensor) -> AffineCodes:
        """The rows ``ids``, in that order, as codes (a row is never split across groups)."""
        return AffineCodes(
            self.codes[ids],
            self.scale[ids],
            None if self.offset is None else self.offset[ids],
            self.zero_code,
            self.group_size,
            self.bits,
        )

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Exact float32 weights of some rows ``[len(ids), in_features]``."""
        return self.take(ids).dequantize()
