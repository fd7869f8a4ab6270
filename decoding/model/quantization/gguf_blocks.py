"""Decode a GGUF tensor's raw quantized blocks into integer codes and per-group scales, as stored.

Each decoder reads ggml's block layout (``ggml-common.h``; the same layout ``gguf.quants``
dequantizes in numpy) and returns ``AffineCodes``: the file's own integers and its own scales,
not a requantization. Scales are multiplied out to float32, which is exact for every type here
(an fp16 ``d`` times a 6-bit sub-block scale needs at most 17 significant bits).

Supported: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32-element blocks), Q4_K, Q5_K (256-element super-blocks
of eight 32-element sub-blocks with 6-bit scales and mins) and Q6_K (sixteen 16-element
sub-blocks with int8 scales). Anything else is refused with ``UnsupportedBlockType``; float
tensors (F32, F16, BF16) are not quantized and stay ordinary float weights.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from decoding.model.quantization.affine import AffineCodes

FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)


class UnsupportedBlockType(ValueError):
    """A GGUF tensor uses a block type this server has no kernel path for."""


def _blocks(raw: np.ndarray, kind: GGMLQuantizationType) -> np.ndarray:
    """``[rows, row_bytes]`` uint8 → ``[rows, blocks_per_row, block_bytes]``."""
    _, block_bytes = GGML_QUANT_SIZES[kind]
    rows = raw.shape[0]
    return np.ascontiguousarray(raw).reshape(rows, -1, block_bytes)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The fp16 field at byte ``start`` of every block, as float32 ``[rows, blocks]``."""
    return np.ascontiguousarray(blocks[:, :, start : start + 2]).view(np.float16)[..., 0].astype(np.float32)


def _nibbles32(qs: np.ndarray) -> np.ndarray:
    """16 bytes → 32 codes: low nibbles are elements 0..15, high nibbles 16..31 (``[..., 32]``)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits32(qh: np.ndarray) -> np.ndarray:
    """4 little-endian bytes → bit ``j`` for element ``j`` (``[..., 32]`` of 0/1)."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: 12 bytes → eight 6-bit scales and eight 6-bit mins (ggml's ``get_scale_min_k4``)."""
    s = scales.astype(np.uint8)
    low_sc, low_m = s[..., 0:4] & 63, s[..., 4:8] & 63
    high_sc = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)
    high_m = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return np.concatenate([low_sc, high_sc], -1), np.concatenate([low_m, high_m], -1)


def _finish(codes: np.ndarray, scale: np.ndarray, offset: np.ndarray | None, zero_code: int | None,
            group_size: int, bits: int) -> AffineCodes:  # fmt: skip
    rows = codes.shape[0]

    def tensor(values: np.ndarray, dtype: type) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(values.reshape(rows, -1), dtype=dtype))

    return AffineCodes(
        codes=tensor(codes, np.uint8),
        scale=tensor(scale, np.float32),
        offset=None if offset is None else tensor(offset, np.float32),
        zero_code=zero_code,
        group_size=group_size,
        bits=bits,
    )


def _q4_0(b: np.ndarray) -> AffineCodes:  # d:f16 qs[16]; w = d * (q - 8)
    return _finish(_nibbles32(b[..., 2:18]), _f16(b, 0), None, 8, 32, 4)


def _q4_1(b: np.ndarray) -> AffineCodes:  # d:f16 m:f16 qs[16]; w = d * q + m
    return _finish(_nibbles32(b[..., 4:20]), _f16(b, 0), _f16(b, 2), None, 32, 4)


def _q5_0(b: np.ndarray) -> AffineCodes:  # d:f16 qh[4] qs[16]; w = d * (q - 16)
    codes = _nibbles32(b[..., 6:22]) | (_high_bits32(b[..., 2:6]) << 4)
    return _finish(codes, _f16(b, 0), None, 16, 32, 5)


def _q5_1(b: np.ndarray) -> AffineCodes:  # d:f16 m:f16 qh[4] qs[16]; w = d * q + m
    codes = _nibbles32(b[..., 8:24]) | (_high_bits32(b[..., 4:8]) << 4)
    return _finish(codes, _f16(b, 0), _f16(b, 2), None, 32, 5)


def _q8_0(b: np.ndarray) -> AffineCodes:  # d:f16 qs[32] int8; w = d * q, stored as code q + 128
    codes = (b[..., 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return _finish(codes, _f16(b, 0), None, 128, 32, 8)


def _q4_k(b: np.ndarray) -> AffineCodes:
    """d:f16 dmin:f16 scales[12] qs[128]; sub-block j: w = d*sc[j] * q - dmin*m[j]."""
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, m = _k_scales(b[..., 4:16])
    qs = b[..., 16:144].reshape(*b.shape[:2], 4, 32)  # four 64-element chunks: low nibbles, then high
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    return _finish(codes, d[..., None] * sc, -(dmin[..., None] * m), None, 32, 4)


def _q5_k(b: np.ndarray) -> AffineCodes:
    """d:f16 dmin:f16 scales[12] qh[32] qs[128]; as Q4_K with a fifth bit from qh (bit 2c, 2c+1 in chunk c)."""
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, m = _k_scales(b[..., 4:16])
    qh = b[..., 16:48][:, :, None, :]  # [rows, blocks, 1, 32]
    qs = b[..., 48:176].reshape(*b.shape[:2], 4, 32)
    shifts = (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
    low = (qs & 0x0F) | (((qh >> shifts) & 1) << 4)
    high = (qs >> 4) | (((qh >> (shifts + 1)) & 1) << 4)
    return _finish(np.concatenate([low, high], -1), d[..., None] * sc, -(dmin[..., None] * m), None, 32, 5)


def _q6_k(b: np.ndarray) -> AffineCodes:
    """ql[128] qh[64] scales[16] int8, d:f16; element e of a block: w = d*sc[e // 16] * (q - 32)."""
    ql = b[..., 0:128].reshape(*b.shape[:2], 2, 64)
    qh = b[..., 128:192].reshape(*b.shape[:2], 2, 32)
    sc = b[..., 192:208].view(np.int8).astype(np.float32)
    d = _f16(b, 208)
    parts = [
        (ql[..., 0:32] & 0x0F) | ((qh & 3) << 4),
        (ql[..., 32:64] & 0x0F) | (((qh >> 2) & 3) << 4),
        (ql[..., 0:32] >> 4) | (((qh >> 4) & 3) << 4),
        (ql[..., 32:64] >> 4) | (((qh >> 6) & 3) << 4),
    ]
    codes = np.concatenate(parts, axis=-1)  # [rows, blocks, 2 halves, 128]
    return _finish(codes, d[..., None] * sc, None, 32, 16, 6)


DECODERS: dict[GGMLQuantizationType, Callable[[np.ndarray], AffineCodes]] = {
    GGMLQuantizationType.Q4_0: _q4_0,
    GGMLQuantizationType.Q4_1: _q4_1,
    GGMLQuantizationType.Q5_0: _q5_0,
    GGMLQuantizationType.Q5_1: _q5_1,
    GGMLQuantizationType.Q8_0: _q8_0,
    GGMLQuantizationType.Q4_K: _q4_k,
    GGMLQuantizationType.Q5_K: _q5_k,
    GGMLQuantizationType.Q6_K: _q6_k,
}


def supported_names() -> str:
    return ", ".join(kind.name for kind in DECODERS)


class SuperBlocks(AffineCodes):
    """A K-quant tensor (Q4_K, Q6_K) kept as the file's own super-blocks, its codes decoded on demand.

    ``ktile_matrix`` multiplies the super-blocks as they are (the file's 6-bit scales and fp16 factors
    stay factored, which the decoded form's float32 scale per group cannot), so a load that serves them
    never decodes a whole tensor (1.1 GB of Qwen2.5-Coder-1.5B's blocks were ~1.4 GB of codes and
    ~0.3 GB of float scales, made and dropped); anything that reads ``codes``, ``scale`` or ``offset``
    (the other kernels, tests) gets exactly ``DECODERS``' result, decoded once. ``take`` and ``rows``
    decode only the rows asked for."""

    def __init__(self, raw: np.ndarray, kind: GGMLQuantizationType) -> None:
        block_size, _ = GGML_QUANT_SIZES[kind]
        object.__setattr__(self, "raw", raw)  # [rows, row_bytes] uint8: the file's bytes (may be memory-mapped)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "_decoded", None)
        object.__setattr__(self, "zero_code", 32 if kind == GGMLQuantizationType.Q6_K else None)
        object.__setattr__(self, "group_size", 16 if kind == GGMLQuantizationType.Q6_K else 32)
        object.__setattr__(self, "bits", 6 if kind == GGMLQuantizationType.Q6_K else 4)
        object.__setattr__(self, "_columns", raw.shape[1] // GGML_QUANT_SIZES[kind][1] * block_size)

    def _full(self) -> AffineCodes:
        if self._decoded is None:
            object.__setattr__(self, "_decoded", DECODERS[self.kind](_blocks(self.raw, self.kind)))
        return self._decoded  # type: ignore[return-value]

    @property
    def codes(self) -> torch.Tensor:  # type: ignore[override]
        return self._full().codes

    @property
    def scale(self) -> torch.Tensor:  # type: ignore[override]
        return self._full().scale

    @property
    def offset(self) -> torch.Tensor | None:  # type: ignore[override]
        return self._full().offset

    @property
    def shape(self) -> tuple[int, int]:
        return (self.raw.shape[0], self._columns)

    def take(self, ids: torch.Tensor) -> SuperBlocks:
        return SuperBlocks(self.raw[ids.cpu().numpy()], self.kind)


SUPER_BLOCK_TYPES = (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K)


def decode_blocks(raw: np.ndarray, kind: GGMLQuantizationType, *, tensor_name: str = "tensor") -> AffineCodes:
    """``raw``: a GGUF tensor's bytes as ``[rows, row_bytes]`` uint8 (what ``GGUFReader`` gives).
    Q4_K and Q6_K come back as ``SuperBlocks`` (the bytes kept, decoded on demand)."""
    decoder = DECODERS.get(kind)
    if decoder is None:
        raise UnsupportedBlockType(
            f"{tensor_name} uses GGUF block type {kind.name}, which --quantization gguf cannot run "
            f"(supported: {supported_names()}; float tensors stay float); use --quantization none to "
            "dequantize the file to float instead"
        )
    if kind in SUPER_BLOCK_TYPES:
        return SuperBlocks(raw, kind)
    return decoder(_blocks(raw, kind))
