"""A weight in integer codes, multiplied by PyTorch's CPU int4 kernel without being requantized.

``torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32, scales_and_zeros)`` computes
``x @ W.T`` with ``W[n, k] = (q[n, k] - 8) * s[g, n] + z[g, n]`` over 4-bit codes ``q`` and one
float scale ``s`` and float zero ``z`` per 32 input columns: an asymmetric int4 format whose zero is
a float, so GGUF's ``Q4_1``/``Q4_K`` minimum (``w = d*q + m``) maps onto it as is (``s = d``,
``z = m + 8d``), where an integer zero point would round ``m`` to a multiple of ``d``. It is the
kernel torchao's CPU int4 layout calls, vectorized for AVX-512/AVX2 on bfloat16 activations
(float32 activations take a scalar path ~15x slower), so activations and ``s``/``z`` are bfloat16
and the kernel accumulates in float32. Rounding ``s`` to bfloat16 moves a weight by at most
2^-9 of its block's range, the same relative size as rounding the activations themselves, and
every zero that is an exact multiple of the scale is formed from the rounded scale so it adds no
rounding of its own (tests/test_quantization_kernels.py bounds the error against the float matmul
of the same dequantized weights).

Codes wider than 4 bits (Q5_0, Q5_1, Q5_K, Q8_0, Q6_K) are split into a high and a low nibble
plane over a doubled input (``x' = [x, x]``: the high plane with scale 16s, the low plane with s),
still exact and one kernel call, at 8 bits a weight. Q6_K's 16-column sub-blocks are narrower than
the kernel's smallest group (32), so each sub-block's low and high nibbles share one 32-column
group and the input is laid out as ``[x_j, 16 x_j]``, with the codes shifted so the zero is
exactly ``s``.
"""

from __future__ import annotations

import torch

from decoding.model.quantization.affine import AffineCodes
from decoding.model.quantization.matrix_base import MatrixModule
from decoding.model.quantization.packed_layout import PackedRows, pack_int4

KERNEL_GROUP = 32  # the kernel's smallest group size (it takes 32, 64, 128 or 256)
ROW_MULTIPLE = 16  # the packer's row tile
ACT_DTYPE = torch.bfloat16  # the only activation dtype the CPU kernel vectorizes

PLAIN, TWICE, PAIRED16 = "plain", "twice", "paired16"  # how the input is laid out for the packed codes


class Int4Matrix(MatrixModule):
    """``AffineCodes`` packed for ``_weight_int4pack_mm_for_cpu``; ``matmul(x) = x @ W.T``."""

    def __init__(self, weight: AffineCodes, *, lookup: bool = False) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.source_group = weight.group_size
        self.zero_code = weight.zero_code
        self.plan, nibbles, scale, zero = _layout(weight)
        pad = -self.out_features % ROW_MULTIPLE  # the packer wants whole 16-row tiles; extra rows are zero
        nibbles, scale, zero = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (nibbles, scale, zero))
        self.keep("packed", pack_int4(nibbles))  # [N, K' / 2] uint8, the kernel's own layout
        self.keep("scales_and_zeros", torch.stack([scale.t(), zero.t()], dim=-1).to(ACT_DTYPE).contiguous())
        input_scale = None  # [K'/32, N, 2] above; [K'] here
        if self.plan == PAIRED16:
            ones = torch.ones(self.in_features // 16, 1, 16, device=nibbles.device)
            input_scale = torch.cat([ones, 16 * ones], dim=1).reshape(-1).to(ACT_DTYPE)
        self.keep("input_scale", input_scale)
        # Rows for an embedding lookup, read back from ``packed`` with the file's exact scales.
        self.packed_rows = PackedRows(self.packed, nibbles) if lookup else None
        self.keep("exact_scale", _compact(weight.scale) if lookup else None)
        self.keep("exact_offset", _compact(weight.offset) if lookup and weight.offset is not None else None)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[rows, in_features]`` bfloat16 → ``[rows, out_features]`` bfloat16."""
        return self.forward(x)  # the kernel call itself: no module-call machinery on the per-token path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.plan == TWICE:
            x = torch.cat([x, x], dim=1)
        elif self.plan == PAIRED16:
            x = x.reshape(x.shape[0], -1, 1, 16).expand(-1, -1, 2, -1).reshape(x.shape[0], -1) * self.input_scale
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, KERNEL_GROUP, self.scales_and_zeros)
        return out if out.shape[1] == self.out_features else out[:, : self.out_features]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Exact float32 weights of rows ``ids`` (``[len(ids), in_features]``), for a tied embedding."""
        if self.packed_rows is None or self.exact_scale is None:
            raise RuntimeError("this matrix was packed without lookup support")
        nibbles = self.packed_rows.rows(ids).to(torch.int16)
        k = self.in_features
        if self.plan == PLAIN:
            codes = nibbles
        elif self.plan == TWICE:
            codes = 16 * nibbles[:, :k] + nibbles[:, k:] - self._code_shift()
        else:
            pairs = nibbles.reshape(len(ids), -1, 2, 16)
            codes = (pairs[:, :, 0] + 16 * pairs[:, :, 1]).reshape(len(ids), k) - self._code_shift()
        scale = self.exact_scale[ids].float().repeat_interleave(self.source_group, dim=1)
        if self.exact_offset is not None:
            offset = self.exact_offset[ids].float().repeat_interleave(self.source_group, dim=1)
            return scale * codes.float() + offset
        return scale * (codes.float() - float(self.zero_code or 0))

    def _code_shift(self) -> int:
        """What ``_layout`` added to symmetric codes (``code - zero_code + base``)."""
        if self.zero_code is None:
            return 0
        base = 128 if self.plan == TWICE else 119
        return base - self.zero_code

    def nbytes(self) -> int:
        tensors = [self.packed, self.scales_and_zeros, self.input_scale, self.exact_scale, self.exact_offset]
        extra = self.packed_rows.nbytes() if self.packed_rows is not None else 0
        return extra + sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _layout(w: AffineCodes) -> tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(plan, nibbles [N, K'], kernel scale [N, K'/32], kernel zero [N, K'/32]) in float32.

    Kernel weights are ``(nibble - 8) * s + z``. Scales are rounded to bfloat16 first, and zeros
    that are multiples of the scale are formed from the rounded scale by powers of two (exact).
    """
    if w.group_size % 16 or w.shape[1] % w.group_size:
        raise ValueError(f"cannot lay out {w.shape} with group size {w.group_size} for the int4 kernel")
    s = w.scale.to(ACT_DTYPE).float()  # [N, G], the scale as the kernel will see it
    codes = w.codes.to(torch.int16)
    if w.group_size % KERNEL_GROUP == 0:
        repeat = w.group_size // KERNEL_GROUP
        s = s.repeat_interleave(repeat, dim=1)
        offset = None if w.offset is None else w.offset.repeat_interleave(repeat, dim=1)
        if w.bits <= 4:
            zero = (8.0 - w.zero_code) * s if offset is None else offset + 8 * s  # type: ignore[operator]
            return PLAIN, codes, s, zero
        if offset is None:  # symmetric: shift to 0..255 so the planes' zeros are 0 and 8s
            shifted = codes - w.zero_code + 128  # type: ignore[operator]
            _check_range(shifted, w)
            high, low = shifted >> 4, shifted & 0x0F
            return TWICE, torch.cat([high, low], 1), torch.cat([16 * s, s], 1), torch.cat([0 * s, 8 * s], 1)
        high, low = codes >> 4, codes & 0x0F
        return TWICE, torch.cat([high, low], 1), torch.cat([16 * s, s], 1), torch.cat([128 * s, 8 * s + offset], 1)
    if w.offset is not None:
        raise ValueError("asymmetric 16-column groups have no int4 kernel layout")
    # 16-column groups: [low nibbles of group j | high nibbles of group j] against [x_j | 16 x_j];
    # (l - 8)s + z + 16((h - 8)s + z) = s(16h + l) - 136s + 17z, so codes + 119 - zero_code and z = s.
    shifted = codes - w.zero_code + 119  # type: ignore[operator]
    _check_range(shifted, w)
    rows = shifted.shape[0]
    groups = shifted.reshape(rows, -1, 1, 16)
    nibbles = torch.cat([groups & 0x0F, groups >> 4], dim=2).reshape(rows, -1)
    return PAIRED16, nibbles, s, s.clone()


def _check_range(shifted: torch.Tensor, w: AffineCodes) -> None:
    if int(shifted.min()) < 0 or int(shifted.max()) > 255:
        raise ValueError(f"codes of {w.bits} bits with zero code {w.zero_code} do not fit one byte")


def _compact(values: torch.Tensor | None) -> torch.Tensor | None:
    """float32 → float16 when that is exact (GGUF's own fp16 scales), halving the lookup's scales."""
    if values is None:
        return None
    half = values.to(torch.float16)
    return half if torch.equal(half.float(), values) else values
