"""The native block kernel (``block_matrix``): its stated error, row independence, where it serves.

Bound (stated once, used everywhere): the kernel rounds each activation to its 32-column block's
int8 grid, ``dx = max|x_block| / 127``, so an activation moves by at most ``dx / 2``; the rest is
float32 arithmetic. An output therefore differs from the float64 product of the input and the
exact dequantized weights by at most ``sum_b max|x_b| / 254 * sum_{i in b} |w_i|`` plus float32
rounding (``2**-16 * (|x| @ |W|.T)``, generous), and, for bfloat16 output, its rounding
(``2**-8`` of the output's magnitude bound). Each output must also equal the float64 product of
those rounded activations and the exact weights to float32 rounding: a kernel that, say, added the
minimum term with the unrounded activations' sum stays inside the bound but fails this.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType

from decoding.model.quantization import apply, block_matrix, ktile_matrix
from decoding.model.quantization.block_matrix import (
    BlockMatrix,
    deinterleave_bytes,
    interleave_bytes,
    pack_codes,
    pack_nibbles,
    unpack_codes,
)
from decoding.model.quantization.gguf_blocks import decode_blocks
from decoding.model.quantization.int4_matrix import Int4Matrix
from decoding.model.quantization.ktile_matrix import KTileMatrix
from decoding.model.quantization.weight_only import quantize_int4
from tests.test_quantization_kernels import random_blocks

T = GGMLQuantizationType
FOUR_BIT = [T.Q4_0, T.Q4_1, T.Q4_K]

WIDE = [T.Q5_0, T.Q5_1, T.Q5_K, T.Q6_K, T.Q8_0]
VNNI = block_matrix.isa() == block_matrix.AVX512_VNNI

pytestmark = pytest.mark.skipif(not block_matrix.available(), reason="no AVX2 / AVX-512 VNNI build of the kernel here")
needs_vnni = pytest.mark.skipif(not VNNI, reason="8-bit codes need AVX-512 VNNI")


def bound(x: torch.Tensor, weight: torch.Tensor, bf16_out: bool) -> torch.Tensor:
    rows, k = x.shape
    block_max = x.double().abs().reshape(rows, -1, 32).amax(-1, keepdim=True).expand(-1, -1, 32).reshape(rows, k)
    magnitude = x.double().abs() @ weight.double().abs().t()
    rounding = (block_max / 254) @ weight.double().abs().t()
    return rounding + magnitude * (2.0**-8 if bf16_out else 2.0**-16) + 1e-30


def rounded_activations(x: torch.Tensor) -> torch.Tensor:
    """What the kernel multiplies by: each 32-column block on its int8 grid (scale max|x| / 127 in
    float32, round half to even), in float64."""
    blocks = x.float().reshape(x.shape[0], -1, 32)
    top = blocks.abs().amax(-1, keepdim=True)
    # a float32 division, as the kernels divide: ``127 / top`` (a scalar over a tensor) multiplies by the
    # reciprocal, 1 ulp away at times, which moves a code that lands near a half the other way
    inverse = torch.where(top > 0, torch.full_like(top, 127.0) / top, torch.zeros_like(top))
    return (torch.round(blocks * inverse).double() * (top / 127).double()).reshape(x.shape)


def assert_within_bound(matrix: BlockMatrix, weight: torch.Tensor, x: torch.Tensor) -> None:
    got = matrix.matmul(x)
    assert got.dtype == x.dtype and got.shape == (x.shape[0], weight.shape[0])
    exact = x.double() @ weight.double().t()
    worst = float(((got.double() - exact).abs() / bound(x, weight, x.dtype == torch.bfloat16)).max())
    assert worst <= 1.0, f"error {worst:.2f}x the bound"
    # and it is exactly that rounding, the rest float32 arithmetic: nothing else moves the result
    rounded = rounded_activations(x)
    simulated = rounded @ weight.double().t()
    float_error = (rounded.abs() @ weight.double().abs().t()) * (2.0**-8 if x.dtype == torch.bfloat16 else 2.0**-18)
    assert bool(((got.double() - simulated).abs() <= float_error + 1e-30).all())


@pytest.mark.parametrize("kind", FOUR_BIT, ids=lambda k: k.name)
@pytest.mark.parametrize("rows", [1, 3, 5, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_each_four_bit_block_type_is_within_the_stated_bound(kind, rows, dtype):
    width = 256 if kind == T.Q4_K else 96  # 96: three blocks, a group of four with one missing
    codes = decode_blocks(random_blocks(kind, 70, width, seed=rows), kind)  # 70 rows: a tile of 4 with a tail
    matrix = BlockMatrix(codes)
    torch.manual_seed(rows)
    x = torch.randn(rows, width).to(dtype)
    assert_within_bound(matrix, codes.dequantize(), x)


@needs_vnni
@pytest.mark.parametrize("kind", WIDE, ids=lambda k: k.name)
@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_each_wider_block_type_is_within_the_stated_bound(kind, rows, dtype):
    width = 256 if kind in (T.Q5_K, T.Q6_K) else 160  # 160: a group of four blocks and one of one
    codes = decode_blocks(random_blocks(kind, 70, width, seed=rows), kind)
    matrix = BlockMatrix(codes)
    assert matrix.bits == codes.bits  # 5-bit codes as nibbles and a plane, Q6_K's as nibbles and two
    torch.manual_seed(rows)
    assert_within_bound(matrix, codes.dequantize(), torch.randn(rows, width).to(dtype))


@needs_vnni
@pytest.mark.parametrize("kind", WIDE, ids=lambda k: k.name)
def test_an_embedding_reads_exact_rows_back_from_each_wide_layout(kind):
    width = 256 if kind in (T.Q5_K, T.Q6_K) else 96
    codes = decode_blocks(random_blocks(kind, 40, width), kind)
    matrix = BlockMatrix(codes)
    ids = torch.tensor([0, 39, 7, 7, 12])
    assert torch.equal(matrix.rows(ids), codes.rows(ids))


def test_the_8_bit_layout_interleaves_a_groups_halves_and_comes_back():
    codes = torch.randint(0, 256, (3, 32 * 6), dtype=torch.uint8)  # a group of four blocks, then one of two
    stored = interleave_bytes(codes)
    assert torch.equal(stored[:, :16], codes[:, :16]) and torch.equal(stored[:, 16:32], codes[:, 32:48])
    assert torch.equal(stored[:, 64:80], codes[:, 16:32])  # the first block's columns 16..31 after the low halves
    assert torch.equal(stored[:, 128 + 16 : 128 + 32], codes[:, 160:176])  # the tail group: block 5's low half
    assert torch.equal(deinterleave_bytes(stored), codes)


@pytest.mark.parametrize("bits", [5, 6])
def test_the_bit_planes_hold_each_codes_high_bits_in_the_kernels_order_and_come_back(bits):
    codes = torch.randint(0, 1 << bits, (3, 32 * 6), dtype=torch.uint8)  # a group of four blocks, then one of two
    stored = pack_codes(codes, bits)
    assert stored.shape == (3, 6 * 16 + 2 * (bits - 4) * 16)  # nibbles, then 16 bytes a plane and group
    assert torch.equal(stored[:, :96], pack_nibbles(codes & 0x0F))
    first_plane_low = int.from_bytes(bytes(stored[0, 96:104].tolist()), "little")
    block, column = 2, 9  # bit 16 * 2 + 9 of the low halves' mask: block 2, column 9
    assert (first_plane_low >> (16 * block + column)) & 1 == (int(codes[0, 32 * block + column]) >> 4) & 1
    assert torch.equal(unpack_codes(stored, bits, codes.shape[1]), codes)


@needs_vnni
def test_symmetric_types_store_no_minimums_and_q6_k_keeps_a_scale_per_16_columns():
    q5 = BlockMatrix(decode_blocks(random_blocks(T.Q5_0, 8, 64), T.Q5_0))
    q6 = BlockMatrix(decode_blocks(random_blocks(T.Q6_K, 8, 256), T.Q6_K))
    q4k = BlockMatrix(decode_blocks(random_blocks(T.Q4_K, 8, 256), T.Q4_K))
    assert (q5.zero, q5.mins.numel(), q5.scale_columns) == (16, 0, 32)
    assert (q6.zero, q6.mins.numel(), q6.scale_columns, tuple(q6.scales.shape)) == (32, 0, 16, (8, 16))
    assert q4k.zero == -1 and q4k.mins.shape == (8, 8)  # Q4_K's minimums are its own


def test_int4_quantized_weights_of_a_model_shape_are_within_the_bound():
    torch.manual_seed(0)
    weight = quantize_int4(torch.randn(1536, 576) * 0.05)
    assert_within_bound(BlockMatrix(weight), weight.dequantize(), torch.randn(16, 576))


def test_the_matrix_multiplies_exactly_the_codes_it_was_given():
    codes = decode_blocks(random_blocks(T.Q4_1, 33, 160), T.Q4_1)
    matrix = BlockMatrix(codes)
    assert torch.equal(matrix.dequantize(), codes.dequantize())
    assert matrix.scales.dtype == torch.float16  # Q4_1 stores fp16 scales and minimums: kept, exact
    k_quant = decode_blocks(random_blocks(T.Q4_K, 8, 256), T.Q4_K)  # d * sc products need float32
    assert BlockMatrix(k_quant).scales.dtype == torch.float32
    assert torch.equal(BlockMatrix(k_quant).dequantize(), k_quant.dequantize())


def test_blocks_are_packed_in_ggmls_nibble_order():
    codes = torch.arange(32, dtype=torch.uint8).remainder(16).reshape(1, 32)
    packed = pack_nibbles(codes)
    assert packed.tolist() == [[(i % 16) | ((i + 16) % 16) << 4 for i in range(16)]]


def test_a_rows_output_does_not_depend_on_the_rows_beside_it():
    """A request's tokens must not change with how many rows share its step."""
    torch.manual_seed(1)
    weight = quantize_int4(torch.randn(200, 576))
    matrix = BlockMatrix(weight)
    batch = torch.randn(16, 576)
    together = matrix.matmul(batch)
    for row in (0, 5, 15):
        assert torch.equal(matrix.matmul(batch[row : row + 1]), together[row : row + 1])


def test_zero_rows_and_zero_blocks_of_input_are_handled():
    weight = quantize_int4(torch.randn(8, 64))
    matrix = BlockMatrix(weight)
    assert matrix.matmul(torch.zeros(0, 64)).shape == (0, 8)
    x = torch.zeros(2, 64)
    x[1, 32:] = 1.0  # one all-zero block (scale 0) beside a constant one
    assert_within_bound(matrix, weight.dequantize(), x)


def test_the_operator_traces_under_torch_compile():
    weight = quantize_int4(torch.randn(64, 128))
    matrix = BlockMatrix(weight)
    compiled = torch.compile(lambda x: matrix.matmul(x) * 2, backend="aot_eager", dynamic=True)
    x = torch.randn(3, 128)
    assert torch.equal(compiled(x), matrix.matmul(x) * 2)


def test_bad_inputs_are_refused_by_the_operator():
    matrix = BlockMatrix(quantize_int4(torch.randn(8, 64)))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        matrix.matmul(torch.zeros(1, 64, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="the format's bytes a row"):
        matrix.matmul(torch.zeros(1, 96))


def test_gguf_block_types_take_the_native_kernel_where_it_runs_and_the_rest_stay(monkeypatch):
    q4 = decode_blocks(random_blocks(T.Q4_1, 32, 64), T.Q4_1)
    q8 = decode_blocks(random_blocks(T.Q8_0, 32, 64), T.Q8_0)
    q5 = decode_blocks(random_blocks(T.Q5_0, 32, 64), T.Q5_0)
    q6 = decode_blocks(random_blocks(T.Q6_K, 32, 256), T.Q6_K)
    assert isinstance(apply._codes_matrix(q4, lookup=False), BlockMatrix)
    assert isinstance(apply._codes_matrix(q4, lookup=True), Int4Matrix)  # a 4-bit embedding reads the int4 layout
    wide = BlockMatrix if VNNI else Int4Matrix  # 5- to 8-bit codes and Q6_K's 16-column groups: AVX-512 VNNI only
    assert isinstance(apply._codes_matrix(q5, lookup=False), wide)
    k_quants = KTileMatrix if ktile_matrix.available() else wide  # Q4_K, Q6_K: the tiled kernel (AVX2)
    assert isinstance(apply._codes_matrix(q6, lookup=False), k_quants)
    assert isinstance(apply._codes_matrix(q8, lookup=False), wide)
    assert isinstance(apply._codes_matrix(q8, lookup=True), wide)
    monkeypatch.setattr(block_matrix, "_state", [None])  # as where the kernels cannot be built
    monkeypatch.setattr(ktile_matrix, "_state", [None])
    assert isinstance(apply._codes_matrix(q4, lookup=False), Int4Matrix)
    assert isinstance(apply._codes_matrix(q8, lookup=True), Int4Matrix)
    assert isinstance(apply._codes_matrix(q6, lookup=False), Int4Matrix)


def test_the_embedded_models_blocks_are_within_the_bound():
    from gguf import GGUFReader

    from decoding.model.registry import PACKAGED_MODELS, gguf_parts

    reader = GGUFReader(str(gguf_parts(PACKAGED_MODELS["smollm2-135m-instruct"])[0]))
    names = ["blk.0.ffn_down.weight"] + (["token_embd.weight"] if VNNI else [])  # Q4_1, and the Q8_0 LM head
    for tensor in (t for t in reader.tensors if t.name in names):
        codes = decode_blocks(np.asarray(tensor.data), tensor.tensor_type)
        torch.manual_seed(0)
        assert_within_bound(BlockMatrix(codes), codes.dequantize(), torch.randn(2, codes.shape[1]))
