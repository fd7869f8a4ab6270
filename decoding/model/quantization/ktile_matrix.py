"""GGUF K-quant weights (Q4_K, Q6_K) multiplied as the file factors them, 8 rows a tile (``ktile_dot.cpp``).

``BlockMatrix`` keeps one float scale (and minimum) per 32 or 16 columns. A K-quant's scale is
``d * sc``, an fp16 super-block factor times a 6- or 8-bit sub-block scale: not a float16, so it
cost 4 bytes a group there (Q4_K 6 bits a weight where the file has 4.5; Q6_K 8.5 bits where the
file has 6.6, and on a CPU without AVX-512 VNNI Q6_K took PyTorch's int4 kernel at 8 bits a weight
in bfloat16 arithmetic). At one token a step streams the weights, so this matrix keeps the file's
own factors: the codes, one byte for each sub-block scale (and minimum), fp16 ``d`` (and ``dmin``)
per 256 columns; 4.625 bits a weight for Q4_K, exactly the file's 6.5625 for Q6_K. Rows are
interleaved 8 to a tile, so a 4-byte activation broadcast meets 8 weight rows in one integer
multiply and the float work per scale is one lane-wise multiply-add for 8 outputs; a prompt's
rows share each unpacked weight block 4 at a time.

Activations are rounded exactly as ``BlockMatrix`` rounds them (int8 per 32-column block), so both
kernels have the one error ``tests/test_block_matrix.py`` states. It needs AVX2 (with FMA and F16C);
it uses 256-bit ``vpdpbusd`` where the CPU has AVX-512 VNNI or AVX-VNNI. The operator is built like
``block_dot`` (``build_operators``: -march of this CPU, cached, trusted); where it cannot be, the
caller keeps ``BlockMatrix`` or ``Int4Matrix``. ``DECODA_BLOCK_KERNEL=torch`` turns it off as it
turns off the block kernel.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType

from decoding.kv.native_kernel import build_operators
from decoding.model.quantization.gguf_blocks import SuperBlocks
from decoding.model.quantization.matrix_base import MatrixModule

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("ktile_dot.cpp")
LANES = 8  # weight rows a tile
SUPER = 256  # columns a super-block
KINDS = {GGMLQuantizationType.Q4_K: 4, GGMLQuantizationType.Q6_K: 6}
CODE_BYTES = {4: 1024, 6: 1536}  # a tile's super-block
META_BYTES = {4: 160, 6: 144}
ISA_NAMES = {2: "AVX2 + VNNI", 1: "AVX2"}

_state: list[int | None] = []  # [isa level] once loaded, [None] when unavailable
_loading = threading.Lock()


class KTileMatrix(MatrixModule):
    """``matmul(x) = x @ W.T`` for ``x`` in float32 or bfloat16 (returned in ``x``'s dtype); ``rows(ids)``
    gives exact float32 weight rows, so the same matrix serves an embedding."""

    input_dtypes = (torch.float32, torch.bfloat16)

    def __init__(self, weight: SuperBlocks) -> None:
        super().__init__()
        if not fits(weight):
            raise ValueError(f"{weight.kind.name} blocks of {weight.shape} do not fit the tiled kernel here")
        self.kind = KINDS[weight.kind]
        self.out_features, self.in_features = weight.shape
        tiles, supers = -(-self.out_features // LANES), self.in_features // SUPER
        codes = torch.empty(tiles, supers * CODE_BYTES[self.kind], dtype=torch.uint8, device="cpu")
        meta = torch.empty(tiles, supers * META_BYTES[self.kind], dtype=torch.uint8, device="cpu")
        with warnings.catch_warnings():  # a memory-mapped file is read-only; the packer only reads it
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.from_numpy(np.ascontiguousarray(weight.raw))
        torch.ops.decoda_ktile.pack(raw, codes, meta, self.kind)
        self.keep("codes", codes)
        self.keep("meta", meta)
        self._refresh_operands()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return torch.ops.decoda_ktile.linear(x, self.codes, self.meta, self.kind, self.out_features)
        return _LINEAR[0](x, *self._operands)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Exact float32 weights of rows ``ids`` (``[len(ids), in_features]``), as ``AffineCodes.dequantize``."""
        return torch.ops.decoda_ktile.rows(self.codes, self.meta, ids.reshape(-1).long().contiguous(), self.kind)

    def dequantize(self) -> torch.Tensor:
        return self.rows(torch.arange(self.out_features, device=self.codes.device))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.meta))

    def _refresh_operands(self) -> None:
        """The operator's arguments as a plain tuple (an eager call skips the buffers' attribute lookups)."""
        self._operands = (self.codes, self.meta, self.kind, self.out_features)

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202
        module = super()._apply(fn, recurse)
        self._refresh_operands()
        return module


def fits(weight: object) -> bool:
    """Q4_K or Q6_K super-blocks, whole, on a CPU whose build of the kernel multiplies."""
    return isinstance(weight, SuperBlocks) and weight.kind in KINDS and isa() is not None


def available() -> bool:
    """True when the operator is built and multiplies on this CPU (AVX2, FMA and F16C at least)."""
    return isa() is not None


def isa() -> str | None:
    """The instructions the product uses here, None when it is not used."""
    if not _state:
        with _loading:
            if not _state:
                _state.append(_load())
    return ISA_NAMES.get(_state[0]) if _state[0] is not None else None


_LINEAR: list = []  # [torch.ops.decoda_ktile.linear.default] once loaded


def _load() -> int | None:
    if os.environ.get("DECODA_BLOCK_KERNEL") == "torch":
        return None
    if build_operators(SOURCE, "ktile_dot", _register_fakes) is None:
        logger.warning("tiled K-quant kernel unavailable: Q4_K/Q6_K weights take the block kernel or PyTorch's")
        return None
    level = int(torch.ops.decoda_ktile.isa())
    if level == 0:
        logger.info("tiled K-quant kernel built without AVX2: Q4_K/Q6_K weights take the block kernel or PyTorch's")
        return None
    logger.info("tiled K-quant kernel: %s", ISA_NAMES[level])
    return level


def _register_fakes() -> None:
    torch.library.register_fake("decoda_ktile::linear", _linear_shape)
    torch.library.register_fake("decoda_ktile::linear_part", _part_shape)
    torch.library.register_fake("decoda_ktile::rows", _rows_shape)  # an embedding inside a compiled forward
    _LINEAR.append(torch.ops.decoda_ktile.linear.default)


def _linear_shape(x, codes, meta, kind, n):  # noqa: ANN001, ANN202
    return x.new_empty((x.shape[0], n))


def _part_shape(x, codes, meta, kind, n, start, end):  # noqa: ANN001, ANN202
    return x.new_empty((x.shape[0], end - start))


def _rows_shape(codes, meta, ids, kind):  # noqa: ANN001, ANN202
    return codes.new_empty((ids.shape[0], codes.shape[1] // CODE_BYTES[kind] * SUPER), dtype=torch.float32)
