"""Sibling linears that read the same input (q/k/v, gate/up) as one block matrix, read in one call.

At one token a step is ~210 block-kernel calls on SmolLM2, most of them small (K and V are 192x576:
~5 us of a call is its fixed cost, and two threads share 192 rows badly). A layer's query, key and
value projections all multiply the same normalized hidden state, as do an MLP's gate and up
projections; with their weights stacked into one matrix, the first of them computes the whole
product and the others cut their rows from it (``decoda_blocks::linear_part``, which remembers its
thread's last product). SmolLM2 gguf, one row, every block matrix of a step in forward order:
211 calls 6.30 ms, 121 fused calls 5.71 ms.

Which linears are siblings is read from their names within one module (``q_proj``/``k_proj``/
``v_proj``, ``gate_proj``/``up_proj``, the names transformers' decoder families share); the kernel
checks that the input really is the last one (by its bytes), so siblings that turn out to read
different inputs only cost a full product each, never a wrong row. The stacked matrix is the only
copy: each part keeps a view of it, so the memory does not grow. K-quant tiles (``KTileMatrix``,
8 rows a tile) stack the same way, tile after tile, where every part's rows fill whole tiles.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from decoding.model.quantization.block_matrix import BlockMatrix
from decoding.model.quantization.ktile_matrix import LANES, KTileMatrix
from decoding.model.quantization.matrix_base import MatrixModule
from decoding.model.quantization.modules import QuantizedLinear

logger = logging.getLogger(__name__)

SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class BlockMatrixPart(BlockMatrix):
    """Rows ``start..end`` of a stacked block matrix: ``matmul(x)`` is ``x`` times those rows, cut from
    the stacked product when the previous call multiplied the same input."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, layout: tuple[int, int, int],
                 in_features: int, start: int, end: int) -> None:  # fmt: skip
        MatrixModule.__init__(self)  # the stacked matrix is built already: BlockMatrix's own __init__ packs codes
        self.keep("codes", codes)  # the stacked matrix's tensors, shared by its parts
        self.keep("scales", scales)
        self.keep("mins", mins)
        self.bits, self.zero, self.scale_columns = layout
        self.start, self.end = start, end
        self.out_features, self.in_features = end - start, in_features
        self._refresh_operands()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.decoda_blocks.linear_part(x, self.codes, self.scales, self.mins, self.bits, self.zero,
                                                   self.scale_columns, self.start, self.end)  # fmt: skip

    def nbytes(self) -> int:
        share = (self.end - self.start) / self.codes.shape[0]
        return int(sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.mins)) * share)

    def dequantize(self) -> torch.Tensor:
        """The float32 weights of these rows (exactly the codes they were given)."""
        return self.rows(torch.arange(self.start, self.end, device=self.codes.device))


def fuse_sibling_products(model: nn.Module) -> int:
    """Stack each run of sibling block-matrix linears of one layout into one matrix (Gemma 3's
    Q5_0 query and key with its Q8_0 value: the query and key); returns how many stacks."""
    fused = 0
    for module in list(model.modules()):  # the loop swaps matrices below these modules
        for names in SIBLINGS:
            linears = [getattr(module, name, None) for name in names]
            run: list = []
            for linear in [*linears, None]:
                if run and _fusable(linear, run[0]):
                    run.append(linear)
                    continue
                if len(run) > 1:
                    _stack(run)
                    fused += 1
                run = [linear] if _fusable(linear, linear) else []
    if fused:
        logger.info("block kernel: %d groups of sibling linears read as one matrix each", fused)
    return fused


def _fusable(linear: object, first: object) -> bool:
    if not (isinstance(linear, QuantizedLinear) and type(linear.matrix) in (BlockMatrix, KTileMatrix)):
        return False
    a, b = linear.matrix, first.matrix  # type: ignore[union-attr]
    if type(a) is not type(b) or a.in_features != b.in_features or a.codes.device != b.codes.device:
        return False
    if type(a) is KTileMatrix:  # parts stacked tile after tile: each fills whole tiles
        return a.kind == b.kind and a.out_features % LANES == 0 and b.out_features % LANES == 0
    return (a.bits, a.zero, a.scale_columns) == (b.bits, b.zero, b.scale_columns)


def _stack(linears: list[QuantizedLinear]) -> None:
    if type(linears[0].matrix) is KTileMatrix:
        return _stack_tiles(linears)
    matrices: list[BlockMatrix] = [linear.matrix for linear in linears]  # type: ignore[misc]
    # one scale dtype for the stack: float16 only where every part's is (float32 holds float16 exactly)
    dtype = torch.float16 if all(m.scales.dtype == torch.float16 for m in matrices) else torch.float32
    codes = torch.cat([m.codes for m in matrices])
    scales = torch.cat([m.scales.to(dtype) for m in matrices])
    mins = torch.cat([m.mins.to(dtype) for m in matrices])
    start = 0
    for linear, matrix in zip(linears, matrices, strict=True):
        end = start + matrix.out_features
        layout = (matrix.bits, matrix.zero, matrix.scale_columns)
        linear.matrix = BlockMatrixPart(codes, scales, mins, layout, matrix.in_features, start, end)
        start = end


class KTileMatrixPart(KTileMatrix):
    """Rows ``start..end`` of stacked K-quant tiles, cut from the stacked product as ``BlockMatrixPart``."""

    def __init__(self, codes: torch.Tensor, meta: torch.Tensor, kind: int, total: int, in_features: int,
                 start: int, end: int) -> None:  # fmt: skip
        MatrixModule.__init__(self)  # the stacked tiles are packed already
        self.keep("codes", codes)
        self.keep("meta", meta)
        self.kind, self.total, self.start, self.end = kind, total, start, end
        self.out_features, self.in_features = end - start, in_features
        self._refresh_operands()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.decoda_ktile.linear_part(x, self.codes, self.meta, self.kind, self.total, self.start,
                                                  self.end)  # fmt: skip

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return super().rows(ids + self.start)

    def nbytes(self) -> int:
        return int(sum(t.numel() * t.element_size() for t in (self.codes, self.meta)) * self.out_features / self.total)


def _stack_tiles(linears: list[QuantizedLinear]) -> None:
    matrices: list[KTileMatrix] = [linear.matrix for linear in linears]  # type: ignore[misc]
    codes = torch.cat([m.codes for m in matrices])
    meta = torch.cat([m.meta for m in matrices])
    total = sum(m.out_features for m in matrices)
    start = 0
    for linear, matrix in zip(linears, matrices, strict=True):
        end = start + matrix.out_features
        linear.matrix = KTileMatrixPart(codes, meta, matrix.kind, total, matrix.in_features, start, end)
        start = end
