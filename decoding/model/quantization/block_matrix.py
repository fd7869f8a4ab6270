"""Block weights (GGUF's own codes) multiplied by int8-quantized activations in a native operator.

At one token a step is bound by streaming the weights; PyTorch's int4 kernel widens each weight
to bfloat16 first and reaches about half the memory bandwidth on a small model's matrices, and
holds 5- to 8-bit codes as two 4-bit planes against a doubled input. This matrix keeps the
file's codes with a scale and a minimum per 32 columns and multiplies with integer dot products
against activations quantized per 32-column block to int8, as llama.cpp multiplies Q4_1 by Q8_1
(``block_dot.cpp``; ``loadtests/bench_step.py --ab-kernel`` measures it against PyTorch's kernel).
4-bit codes (Q4_0, Q4_1, Q4_K, ``--quantization int4``) stay two a byte; 5- and 6-bit codes (Q5_0,
Q5_1, Q5_K, Q6_K with its scale per 16 columns) are those nibbles plus one or two bit planes, and
Q8_0 a byte each, where the CPU has AVX-512 VNNI; those also serve an embedding's row lookups (a
tied LM head is then one copy). Symmetric types keep no minimums there (``layout_of``).

The operator is built with the system C++ compiler against the installed torch on first use
(cached and trusted like the paged-attention kernel, ``decoding.kv.native_kernel``) for this CPU,
and picks its instructions from what the compiler targets: AVX-512 VNNI, else AVX2 (4-bit codes
only). Where neither is available, or the build fails, ``isa()`` is None and the caller keeps
``Int4Matrix``; ``DECODA_BLOCK_KERNEL=torch`` forces that.

Error: each activation is rounded to its block's int8 grid (at most ``max|x_block| / 254``), the
rest is float32 arithmetic (``tests/test_block_matrix.py`` states and checks the bound). Scales and
minimums are kept as float16 when that is exact (GGUF's fp16 fields), else float32.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import numpy as np
import torch

from decoding.kv.native_kernel import build_operators
from decoding.model.quantization.affine import AffineCodes
from decoding.model.quantization.matrix_base import MatrixModule

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("block_dot.cpp")
BLOCK = 32
GROUP = 4  # blocks the 8-bit layout interleaves
AVX512_VNNI, AVX2 = "AVX-512 VNNI", "AVX2"
ISA_NAMES = {2: AVX512_VNNI, 1: AVX2}

_state: list[int | None] = []  # [isa level] once loaded, [None] when unavailable
_loading = threading.Lock()  # the start-up builds it in the background (decoding.engine.prebuild)
_LINEAR: list = []  # [torch.ops.decoda_blocks.linear.default] once loaded


class BlockMatrix(MatrixModule):
    """``matmul(x) = x @ W.T`` for ``x`` in float32 or bfloat16, returned in ``x``'s dtype."""

    input_dtypes = (torch.float32, torch.bfloat16)

    def __init__(self, weight: AffineCodes) -> None:
        super().__init__()
        if not fits(weight):
            raise ValueError(f"{weight.bits}-bit codes in groups of {weight.group_size} do not fit this kernel here")
        self.out_features, self.in_features = weight.shape
        self.bits, self.zero, self.scale_columns = layout_of(weight)
        self.keep("codes", pack_codes(weight.codes, self.bits))
        if self.scale_columns == BLOCK:
            scale = weight.scale.repeat_interleave(weight.group_size // BLOCK, dim=1)
        else:
            scale = weight.scale
        offset = None if self.zero >= 0 else weight.offsets().repeat_interleave(weight.group_size // BLOCK, dim=1)
        exact = _exact_in_half(scale) and (offset is None or _exact_in_half(offset))
        dtype = torch.float16 if exact else torch.float32
        self.keep("scales", scale.to(dtype).contiguous())
        no_mins = torch.empty(0, dtype=dtype, device=scale.device)
        self.keep("mins", no_mins if offset is None else offset.to(dtype).contiguous())
        self._refresh_operands()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return torch.ops.decoda_blocks.linear(x, self.codes, self.scales, self.mins, self.bits, self.zero,
                                                  self.scale_columns)  # fmt: skip
        return _LINEAR[0](x, *self._operands)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Exact float32 weights of rows ``ids`` (``[len(ids), in_features]``), for a tied embedding:
        ``scale * code + min`` as ``AffineCodes.dequantize`` computes it."""
        codes = unpack_codes(self.codes[ids], self.bits, self.in_features).float()
        scale = self.scales[ids].float().repeat_interleave(self.scale_columns, dim=1)
        if self.zero >= 0:
            return scale * codes - float(self.zero) * scale
        return scale * codes + self.mins[ids].float().repeat_interleave(BLOCK, dim=1)

    def dequantize(self) -> torch.Tensor:
        """The float32 weights this matrix multiplies by (exactly the codes it was given)."""
        return self.rows(torch.arange(self.out_features, device=self.codes.device))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.mins))

    def _refresh_operands(self) -> None:
        """The operator's arguments as a plain tuple: an eager call skips three nn.Module attribute
        lookups (~0.9 us each, 210 linears a step); a compiled graph reads the buffers (shared graph
        inputs)."""
        self._operands = (self.codes, self.scales, self.mins, self.bits, self.zero, self.scale_columns)

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202
        """Keep the eager tuple pointing at the buffers when ``.to()`` replaces them."""
        module = super()._apply(fn, recurse)
        self._refresh_operands()
        return module


def fits(weight: AffineCodes) -> bool:
    """Codes this machine's kernel multiplies: whole 32-column groups of 4-bit codes (AVX2 or
    AVX-512 VNNI), up to 8 bits (AVX-512 VNNI), and Q6_K's symmetric 6-bit codes with a scale per
    16 columns (AVX-512 VNNI)."""
    if weight.shape[1] % BLOCK or isa() is None or weight.bits > 8:
        return False
    if weight.group_size == BLOCK // 2:
        return isa() == AVX512_VNNI and weight.zero_code is not None and weight.bits <= 6
    if weight.group_size % BLOCK:
        return False
    return weight.bits <= 4 or isa() == AVX512_VNNI


def layout_of(weight: AffineCodes) -> tuple[int, int, int]:
    """(bits as stored, zero code or -1 for stored minimums, columns a scale covers) for codes that fit.

    Symmetric types (a zero code, no offsets) store no minimums where the kernel has AVX-512 VNNI: it
    subtracts ``zero`` inside its integer dot product, which saves the minimums' bytes (10.5 MB of
    Gemma 3's 190 MB head) and a multiply-add a block. AVX2 takes minimums for every type."""
    bits = 4 if weight.bits <= 4 else 5 if weight.bits == 5 else 6 if weight.bits == 6 else 8
    symmetric = weight.zero_code is not None and isa() == AVX512_VNNI
    scale_columns = BLOCK // 2 if weight.group_size == BLOCK // 2 else BLOCK
    return bits, weight.zero_code if symmetric else -1, scale_columns


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """``[N, K]`` codes → the kernel's layout for ``bits`` (``block_dot.cpp``'s ``row_bytes_of``):
    nibbles, nibbles and bit planes, or bytes."""
    if bits == 4:
        return pack_nibbles(codes)
    if bits == 8:
        return interleave_bytes(codes)
    return torch.cat([pack_nibbles(codes & 0x0F), pack_planes(codes, bits)], dim=1).contiguous()


def unpack_codes(stored: torch.Tensor, bits: int, width: int) -> torch.Tensor:
    """The inverse of ``pack_codes``: ``[n, K]`` codes in column order."""
    if bits == 8:
        return deinterleave_bytes(stored)
    nibbles = stored[:, : width // 2].reshape(len(stored), -1, 16)  # a block's 16 bytes: columns i and i + 16
    codes = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=2).reshape(len(stored), -1)
    return codes if bits == 4 else codes | unpack_planes(stored[:, width // 2 :], bits, width)


def pack_planes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Bits 4.. of ``[N, K]`` codes as the kernel's planes: per group of 4 blocks and per plane, 64 bits
    for the low halves (bit ``16 j + i``: column ``i`` of block ``j``) then 64 for the high halves
    (column ``16 + i``), little-endian; a last group of fewer blocks is padded with zeros."""
    rows, width = codes.shape
    groups = -(-width // (GROUP * BLOCK))
    padded = torch.zeros(rows, groups * GROUP * BLOCK, dtype=torch.uint8, device=codes.device)
    padded[:, :width] = codes.to(torch.uint8)
    halves = padded.reshape(rows, groups, GROUP, 2, 16).transpose(2, 3)  # [rows, groups, half, block, column]
    planes = []
    for plane in range(bits - 4):
        bit = ((halves >> (4 + plane)) & 1).reshape(rows, groups, 2, 64).numpy()
        planes.append(torch.from_numpy(np.packbits(bit, axis=-1, bitorder="little")))  # [rows, groups, 2, 8]
    return torch.stack(planes, dim=2).reshape(rows, -1).contiguous()  # [rows, groups * planes * 16]


def unpack_planes(stored: torch.Tensor, bits: int, width: int) -> torch.Tensor:
    """Bits 4.. of each code, in column order, from ``pack_planes``' layout."""
    rows = stored.shape[0]
    groups = -(-width // (GROUP * BLOCK))
    packed = stored.reshape(rows, groups, bits - 4, 2, 8).numpy()
    bits_ = np.unpackbits(packed, axis=-1, bitorder="little")  # [rows, groups, planes, half, 64]
    weights = (1 << (4 + np.arange(bits - 4, dtype=np.uint8)))[None, None, :, None, None]
    high = (bits_ * weights).sum(axis=2).astype(np.uint8)  # [rows, groups, half, 64]
    columns = high.reshape(rows, groups, 2, GROUP, 16).transpose(0, 1, 3, 2, 4).reshape(rows, -1)
    return torch.from_numpy(np.ascontiguousarray(columns[:, :width]))


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` codes in [0, 16) → ``[N, K / 2]`` uint8, ggml's order: byte i of a block holds
    column i (low nibble) and column i + 16 (high nibble)."""
    blocks = codes.to(torch.uint8).reshape(codes.shape[0], -1, 2, 16)
    return (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(codes.shape[0], -1).contiguous()


def interleave_bytes(codes: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` byte codes → the kernel's 8-bit order: per group of (up to) 4 blocks, columns
    0..15 of each block, then columns 16..31 of each."""
    rows, width = codes.shape
    parts = []
    for start in range(0, width, GROUP * BLOCK):
        group = codes[:, start : start + GROUP * BLOCK].to(torch.uint8).reshape(rows, -1, 2, 16)
        parts.append(group.transpose(1, 2).reshape(rows, -1))
    return torch.cat(parts, dim=1).contiguous()


def deinterleave_bytes(stored: torch.Tensor) -> torch.Tensor:
    """The inverse of ``interleave_bytes``."""
    rows, width = stored.shape
    parts = []
    for start in range(0, width, GROUP * BLOCK):
        group = stored[:, start : start + GROUP * BLOCK].reshape(rows, 2, -1, 16)
        parts.append(group.transpose(1, 2).reshape(rows, -1))
    return torch.cat(parts, dim=1)


def available() -> bool:
    """True when the operator is built and uses integer dot products on this CPU."""
    return isa() is not None


def isa() -> str | None:
    """The instruction set the operator uses here (AVX-512 VNNI, AVX2), None when it is not used."""
    if not _state:
        with _loading:  # one build: a second thread waits for it
            if not _state:
                _state.append(_load())
    return ISA_NAMES.get(_state[0]) if _state[0] is not None else None


def _exact_in_half(values: torch.Tensor) -> bool:
    return bool(torch.equal(values.to(torch.float16).float(), values.float()))


def _load() -> int | None:
    if os.environ.get("DECODA_BLOCK_KERNEL") == "torch":
        return None
    if build_operators(SOURCE, "block_dot", _register_fakes) is None:
        logger.warning("block kernel unavailable: GGUF/int4 weights use PyTorch's int4 kernel (slower at one token)")
        return None
    level = int(torch.ops.decoda_blocks.isa())
    if level == 0:
        logger.info("block kernel built without AVX2 or AVX-512 VNNI: GGUF/int4 weights use PyTorch's int4 kernel")
        return None
    logger.info("block kernel: %s integer dot products", ISA_NAMES[level])
    return level


def _register_fakes() -> None:
    torch.library.register_fake("decoda_blocks::linear", _linear_shape)  # what the compiler traces
    torch.library.register_fake("decoda_blocks::linear_part", _part_shape)
    _LINEAR.append(torch.ops.decoda_blocks.linear.default)


def _linear_shape(x, codes, scales, mins, bits, zero, scale_columns):  # noqa: ANN001, ANN202
    return x.new_empty((x.shape[0], codes.shape[0]))


def _part_shape(x, codes, scales, mins, bits, zero, scale_columns, start, end):  # noqa: ANN001, ANN202
    return x.new_empty((x.shape[0], end - start))
