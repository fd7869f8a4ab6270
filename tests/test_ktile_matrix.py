"""The tiled K-quant kernel (``ktile_matrix``): Q4_K and Q6_K multiplied as the file factors them.

It rounds activations as the block kernel does, so it is held to ``test_block_matrix``'s one stated
bound and its exactness check (each output is the float64 product of the rounded activations and the
exact weights, to float32 rounding). Rows come back exactly (an embedding reads them), a row's output
does not depend on the rows beside it, and GGUF's K-quants take this kernel wherever it is built.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from torch import nn

from decoding.model.quantization import apply, ktile_matrix
from decoding.model.quantization.gguf_blocks import DECODERS, SuperBlocks, decode_blocks
from decoding.model.quantization.ktile_matrix import KTileMatrix
from decoding.model.quantization.modules import QuantizedEmbedding, QuantizedLinear
from decoding.model.quantization.sibling_products import KTileMatrixPart, fuse_sibling_products
from tests.test_block_matrix import assert_within_bound
from tests.test_quantization_kernels import random_blocks

T = GGMLQuantizationType
K_QUANTS = [T.Q4_K, T.Q6_K]

pytestmark = pytest.mark.skipif(not ktile_matrix.available(), reason="no AVX2 build of the tiled kernel here")


def tiled(kind: GGMLQuantizationType, rows: int, cols: int, seed: int = 0) -> tuple[KTileMatrix, SuperBlocks]:
    blocks = decode_blocks(random_blocks(kind, rows, cols, seed=seed), kind)
    assert isinstance(blocks, SuperBlocks)
    return KTileMatrix(blocks), blocks


@pytest.mark.parametrize("kind", K_QUANTS, ids=lambda k: k.name)
@pytest.mark.parametrize("rows", [1, 3, 5, 8, 70])  # 70: past the kernel's 64-row chunk, with a tail of 2
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_each_k_quant_is_within_the_block_kernels_stated_bound(kind, rows, dtype):
    matrix, blocks = tiled(kind, 70, 512, seed=rows)  # 70 weight rows: 8 full tiles and one of 6
    torch.manual_seed(rows)
    assert_within_bound(matrix, blocks.dequantize(), torch.randn(rows, 512).to(dtype))


@pytest.mark.parametrize("kind", K_QUANTS, ids=lambda k: k.name)
def test_rows_come_back_exactly_as_the_file_decodes_them(kind):
    matrix, blocks = tiled(kind, 21, 768)
    ids = torch.tensor([0, 20, 7, 7, 8, 15, 16])
    assert torch.equal(matrix.rows(ids), blocks.rows(ids))
    assert torch.equal(matrix.dequantize(), blocks.dequantize())
    eager = DECODERS[kind](random_blocks(kind, 21, 768).reshape(21, 3, -1))  # the decoder, not the lazy form
    assert torch.equal(blocks.dequantize(), eager.dequantize())


@pytest.mark.parametrize("kind", K_QUANTS, ids=lambda k: k.name)
def test_the_tiles_hold_the_files_bytes_a_weight(kind):
    matrix, _ = tiled(kind, 64, 1024)
    file_bytes = 64 * 1024 // 256 * (144 if kind == T.Q4_K else 210)
    # Q4_K: a byte for each 6-bit scale and minimum instead of 12 bytes for 16 of them (+2.8%); Q6_K: as the file
    assert matrix.nbytes() == (file_bytes + 64 * 4 * 4 if kind == T.Q4_K else file_bytes)


def test_a_rows_output_does_not_depend_on_the_rows_beside_it():
    matrix, _ = tiled(T.Q6_K, 40, 512, seed=3)
    batch = torch.randn(70, 512)
    together = matrix.matmul(batch)
    for row in (0, 5, 63, 64, 69):
        assert torch.equal(matrix.matmul(batch[row : row + 1]), together[row : row + 1])


def test_super_blocks_decode_only_what_is_read():
    raw = random_blocks(T.Q4_K, 12, 512)
    blocks = decode_blocks(raw, T.Q4_K)
    assert blocks.shape == (12, 512) and blocks._decoded is None
    picked = blocks.take(torch.tensor([3, 1]))
    assert picked._decoded is None and picked.shape == (2, 512)
    full = DECODERS[T.Q4_K](raw.reshape(12, 2, -1))
    assert torch.equal(picked.dequantize(), full.dequantize()[[3, 1]])
    assert blocks._decoded is None  # taking rows decoded those rows alone
    assert torch.equal(blocks.codes, full.codes) and blocks.group_size == 32 and blocks.zero_code is None


def test_k_quants_take_the_tiled_kernel_for_products_and_lookups():
    q4k = decode_blocks(random_blocks(T.Q4_K, 16, 256), T.Q4_K)
    q6k = decode_blocks(random_blocks(T.Q6_K, 16, 256), T.Q6_K)
    for blocks in (q4k, q6k):
        assert isinstance(apply._codes_matrix(blocks, lookup=False), KTileMatrix)
        assert isinstance(apply._codes_matrix(blocks, lookup=True), KTileMatrix)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_stacked_siblings_equal_their_own_matrices(dtype):
    module = nn.Module()
    module.q_proj = QuantizedLinear(tiled(T.Q4_K, 64, 256, 1)[0], None, "gguf Q4_K")
    module.k_proj = QuantizedLinear(tiled(T.Q4_K, 16, 256, 2)[0], None, "gguf Q4_K")
    module.v_proj = QuantizedLinear(tiled(T.Q6_K, 16, 256, 3)[0], None, "gguf Q6_K")  # another kind: alone
    x, other = torch.randn(3, 256).to(dtype), torch.randn(3, 256).to(dtype)
    names = ("q_proj", "k_proj", "v_proj")
    with torch.inference_mode():
        expected = {name: getattr(module, name)(x) for name in names}
        dense = {name: getattr(module, name).matrix.dequantize() for name in names}
        expected_other = {name: getattr(module, name)(other) for name in names}
        assert fuse_sibling_products(module) == 1
        assert isinstance(module.q_proj.matrix, KTileMatrixPart) and isinstance(module.k_proj.matrix, KTileMatrixPart)
        assert type(module.v_proj.matrix) is KTileMatrix
        for name in names:
            assert torch.equal(getattr(module, name)(x), expected[name])
            assert torch.equal(getattr(module, name).matrix.dequantize(), dense[name])
        for name in reversed(names):
            assert torch.equal(getattr(module, name)(other), expected_other[name])


def test_parts_that_do_not_fill_whole_tiles_are_not_stacked():
    module = nn.Module()
    module.gate_proj = QuantizedLinear(tiled(T.Q4_K, 20, 256, 1)[0], None, "gguf Q4_K")
    module.up_proj = QuantizedLinear(tiled(T.Q4_K, 20, 256, 2)[0], None, "gguf Q4_K")
    assert fuse_sibling_products(module) == 0


def test_the_operators_trace_under_torch_compile():
    matrix, _ = tiled(T.Q4_K, 16, 256)
    compiled = torch.compile(lambda x: matrix.matmul(x) * 2, backend="aot_eager", dynamic=True)
    x = torch.randn(3, 256)
    assert torch.equal(compiled(x), matrix.matmul(x) * 2)
    embedding = QuantizedEmbedding(matrix, torch.float32, "gguf Q4_K")  # --compile traces the whole forward
    lookup = torch.compile(lambda ids: embedding(ids) + 1, backend="aot_eager", fullgraph=True, dynamic=True)
    ids = torch.tensor([[3, 0, 15]])
    assert torch.equal(lookup(ids), embedding(ids) + 1)


def test_bad_inputs_are_refused_by_the_operator():
    matrix, _ = tiled(T.Q4_K, 8, 256)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        matrix.matmul(torch.zeros(1, 256, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="multiple of 256"):
        matrix.matmul(torch.zeros(1, 96))
    with pytest.raises(RuntimeError, match="bytes a tile"):
        matrix.matmul(torch.zeros(1, 512))
    with pytest.raises(RuntimeError, match="out of range"):
        matrix.rows(torch.tensor([8]))


def test_zero_rows_and_all_zero_blocks_of_input():
    matrix, blocks = tiled(T.Q6_K, 8, 256)
    assert matrix.matmul(torch.zeros(0, 256)).shape == (0, 8)
    x = torch.zeros(2, 256)
    x[1, 32:64] = 1.0
    assert_within_bound(matrix, blocks.dequantize(), x)


def test_real_k_quant_blocks_of_the_embedded_gemma(tmp_path):
    from decoding.model.quantization.gguf_index import GgufIndex
    from decoding.model.registry import PACKAGED_MODELS, gguf_parts

    try:
        parts = gguf_parts(PACKAGED_MODELS["gemma3-270m"])
    except Exception as error:  # the package is optional here
        pytest.skip(f"Gemma 3's package is not installed: {error}")
    joined = tmp_path / "gemma.gguf"
    with joined.open("wb") as out:
        for part in parts:
            out.write(part.read_bytes())
    index = GgufIndex(joined)
    names = ("blk.0.ffn_down.weight", "blk.1.ffn_down.weight", "blk.0.attn_output.weight")  # Q6_K, Q4_K
    tensors = [t for t in index.tensors if t.name in names]
    assert {t.tensor_type for t in tensors} == {T.Q4_K, T.Q6_K}
    for tensor in tensors:
        blocks = decode_blocks(np.asarray(tensor.data), tensor.tensor_type)
        assert isinstance(blocks, SuperBlocks)
        matrix = KTileMatrix(blocks)
        torch.manual_seed(0)
        assert_within_bound(matrix, blocks.dequantize(), torch.randn(2, blocks.shape[1]))
