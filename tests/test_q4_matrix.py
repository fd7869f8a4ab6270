"""The native 4-bit kernel (``q4_matrix``): its stated error, row independence, and where it serves.

Bound (stated once, used everywhere): the kernel rounds each activation to its 32-column block's
int8 grid, ``dx = max|x_block| / 127``, so an activation moves by at most ``dx / 2``; the rest is
float32 arithmetic. An output therefore differs from the float64 product of the input and the
exact dequantized weights by at most ``sum_b max|x_b| / 254 * sum_{i in b} |w_i|`` plus float32
rounding (``2**-16 * (|x| @ |W|.T)``, generous), and, for bfloat16 output, its rounding
(``2**-8`` of the output's magnitude bound).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType

from decoding.model.quantization import apply, q4_matrix
from decoding.model.quantization.gguf_blocks import decode_blocks
from decoding.model.quantization.int4_matrix import Int4Matrix
from decoding.model.quantization.q4_matrix import Q4Matrix, pack_blocks
from decoding.model.quantization.weight_only import quantize_int4
from tests.test_quantization_kernels import random_blocks

T = GGMLQuantizationType
FOUR_BIT = [T.Q4_0, T.Q4_1, T.Q4_K]

pytestmark = pytest.mark.skipif(not q4_matrix.available(), reason="no AVX2 / AVX-512 VNNI build of the q4 kernel here")


def bound(x: torch.Tensor, weight: torch.Tensor, bf16_out: bool) -> torch.Tensor:
    rows, k = x.shape
    block_max = x.double().abs().reshape(rows, -1, 32).amax(-1, keepdim=True).expand(-1, -1, 32).reshape(rows, k)
    magnitude = x.double().abs() @ weight.double().abs().t()
    rounding = (block_max / 254) @ weight.double().abs().t()
    return rounding + magnitude * (2.0**-8 if bf16_out else 2.0**-16) + 1e-30


def assert_within_bound(matrix: Q4Matrix, weight: torch.Tensor, x: torch.Tensor) -> None:
    got = matrix.matmul(x)
    assert got.dtype == x.dtype and got.shape == (x.shape[0], weight.shape[0])
    exact = x.double() @ weight.double().t()
    worst = float(((got.double() - exact).abs() / bound(x, weight, x.dtype == torch.bfloat16)).max())
    assert worst <= 1.0, f"error {worst:.2f}x the bound"


@pytest.mark.parametrize("kind", FOUR_BIT, ids=lambda k: k.name)
@pytest.mark.parametrize("rows", [1, 3, 5, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_each_four_bit_block_type_is_within_the_stated_bound(kind, rows, dtype):
    width = 256 if kind == T.Q4_K else 96  # 96: three blocks, a group of four with one missing
    codes = decode_blocks(random_blocks(kind, 70, width, seed=rows), kind)  # 70 rows: a tile of 4 with a tail
    matrix = Q4Matrix(codes)
    torch.manual_seed(rows)
    x = torch.randn(rows, width).to(dtype)
    assert_within_bound(matrix, codes.dequantize(), x)


def test_int4_quantized_weights_of_a_model_shape_are_within_the_bound():
    torch.manual_seed(0)
    weight = quantize_int4(torch.randn(1536, 576) * 0.05)
    assert_within_bound(Q4Matrix(weight), weight.dequantize(), torch.randn(16, 576))


def test_the_matrix_multiplies_exactly_the_codes_it_was_given():
    codes = decode_blocks(random_blocks(T.Q4_1, 33, 160), T.Q4_1)
    matrix = Q4Matrix(codes)
    assert torch.equal(matrix.dequantize(), codes.dequantize())
    assert matrix.scales.dtype == torch.float16  # Q4_1 stores fp16 scales and minimums: kept, exact
    k_quant = decode_blocks(random_blocks(T.Q4_K, 8, 256), T.Q4_K)  # d * sc products need float32
    assert Q4Matrix(k_quant).scales.dtype == torch.float32
    assert torch.equal(Q4Matrix(k_quant).dequantize(), k_quant.dequantize())


def test_blocks_are_packed_in_ggmls_nibble_order():
    codes = torch.arange(32, dtype=torch.uint8).remainder(16).reshape(1, 32)
    packed = pack_blocks(codes)
    assert packed.tolist() == [[(i % 16) | ((i + 16) % 16) << 4 for i in range(16)]]


def test_a_rows_output_does_not_depend_on_the_rows_beside_it():
    """A request's tokens must not change with how many rows share its step."""
    torch.manual_seed(1)
    weight = quantize_int4(torch.randn(200, 576))
    matrix = Q4Matrix(weight)
    batch = torch.randn(16, 576)
    together = matrix.matmul(batch)
    for row in (0, 5, 15):
        assert torch.equal(matrix.matmul(batch[row : row + 1]), together[row : row + 1])


def test_zero_rows_and_zero_blocks_of_input_are_handled():
    weight = quantize_int4(torch.randn(8, 64))
    matrix = Q4Matrix(weight)
    assert matrix.matmul(torch.zeros(0, 64)).shape == (0, 8)
    x = torch.zeros(2, 64)
    x[1, 32:] = 1.0  # one all-zero block (scale 0) beside a constant one
    assert_within_bound(matrix, weight.dequantize(), x)


def test_the_operator_traces_under_torch_compile():
    weight = quantize_int4(torch.randn(64, 128))
    matrix = Q4Matrix(weight)
    compiled = torch.compile(lambda x: matrix.matmul(x) * 2, backend="aot_eager", dynamic=True)
    x = torch.randn(3, 128)
    assert torch.equal(compiled(x), matrix.matmul(x) * 2)


def test_bad_inputs_are_refused_by_the_operator():
    matrix = Q4Matrix(quantize_int4(torch.randn(8, 64)))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        matrix.matmul(torch.zeros(1, 64, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="in_features / 2"):
        matrix.matmul(torch.zeros(1, 96))


def test_gguf_four_bit_linears_take_the_native_kernel_and_the_rest_stay(monkeypatch):
    q4 = decode_blocks(random_blocks(T.Q4_1, 32, 64), T.Q4_1)
    q8 = decode_blocks(random_blocks(T.Q8_0, 32, 64), T.Q8_0)
    assert isinstance(apply._codes_matrix(q4, lookup=False), Q4Matrix)
    assert isinstance(apply._codes_matrix(q4, lookup=True), Int4Matrix)  # an embedding reads rows back
    assert isinstance(apply._codes_matrix(q8, lookup=False), Int4Matrix)  # 8-bit codes: PyTorch's kernel
    monkeypatch.setattr(q4_matrix, "_state", [None])  # as where the kernel cannot be built
    assert isinstance(apply._codes_matrix(q4, lookup=False), Int4Matrix)


def test_the_embedded_models_blocks_are_within_the_bound():
    from gguf import GGUFReader

    from decoding.model.registry import PACKAGED_MODELS, gguf_parts

    reader = GGUFReader(str(gguf_parts(PACKAGED_MODELS["smollm2-135m-instruct"])[0]))
    tensor = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    codes = decode_blocks(np.asarray(tensor.data), tensor.tensor_type)
    torch.manual_seed(0)
    assert_within_bound(Q4Matrix(codes), codes.dequantize(), torch.randn(2, codes.shape[1]))
