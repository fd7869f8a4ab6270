"""Each low-bit kernel path equals the float matmul of the same dequantized weights, per block type.

Tolerance (stated once, used everywhere): the kernels take bfloat16 activations and bfloat16
scales and return bfloat16, accumulating in float32, so each output may differ from the float64
product of the bfloat16-rounded input and the exact dequantized weights by at most
``2**-7 * (|x| @ |W|.T)`` (a few bfloat16 roundings, 2**-9 each, on the magnitude that can cancel).
Decoding the blocks and reading embedding rows back out of the packed layout are exact.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, quants

from decoding.model.quantization.affine import AffineCodes
from decoding.model.quantization.gguf_blocks import DECODERS, UnsupportedBlockType, decode_blocks
from decoding.model.quantization.int4_matrix import Int4Matrix
from decoding.model.quantization.weight_only import quantize_int4, quantize_int8

T = GGMLQuantizationType
RELATIVE_TOLERANCE = 2.0**-7
# byte offsets of each type's fp16 fields (d, and m / dmin where the type has one)
FP16_FIELDS = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,),
    T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
}  # fmt: skip


@pytest.fixture(scope="module")
def smollm2_gguf():
    from decoding.model.registry import PACKAGED_MODELS, gguf_parts

    return gguf_parts(PACKAGED_MODELS["smollm2-135m-instruct"])[0]


def random_blocks(kind: GGMLQuantizationType, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random bytes are valid blocks for every type once the fp16 scale fields hold sane values."""
    rng = np.random.default_rng(seed)
    block, nbytes = GGML_QUANT_SIZES[kind]
    blocks = rng.integers(0, 256, (rows, cols // block, nbytes), dtype=np.uint8)
    for start in FP16_FIELDS[kind]:
        values = rng.uniform(0.002, 0.05, (rows, cols // block)).astype(np.float16)
        blocks[:, :, start : start + 2] = values.view(np.uint8).reshape(rows, cols // block, 2)
    return blocks.reshape(rows, -1)


def assert_kernel_matches(matrix, weight: torch.Tensor, rows: int = 5) -> None:
    torch.manual_seed(0)
    x = torch.randn(rows, weight.shape[1]).to(torch.bfloat16)
    got = matrix.matmul(x).double()
    exact = x.double() @ weight.double().t()
    bound = RELATIVE_TOLERANCE * (x.double().abs() @ weight.double().abs().t())
    assert got.shape == exact.shape
    worst = float(((got - exact).abs() / bound).max())
    assert worst <= 1.0, f"error {worst:.2f}x the tolerance"


@pytest.mark.parametrize("kind", list(DECODERS), ids=lambda k: k.name)
def test_decoding_a_block_type_equals_gguf_dequantize(kind):
    raw = random_blocks(kind, rows=48, cols=512)
    assert torch.equal(decode_blocks(raw, kind).dequantize(), torch.from_numpy(quants.dequantize(raw, kind)))


@pytest.mark.parametrize("rows", [1, 16, 33])
@pytest.mark.parametrize("kind", list(DECODERS), ids=lambda k: k.name)
def test_int4_kernel_path_equals_the_float_matmul_per_block_type(kind, rows):
    raw = random_blocks(kind, rows=96, cols=512, seed=rows)
    codes = decode_blocks(raw, kind)
    assert_kernel_matches(Int4Matrix(codes), codes.dequantize(), rows=rows)


@pytest.mark.parametrize("kind", [T.Q8_0, T.Q4_1, T.Q6_K], ids=lambda k: k.name)
def test_embedding_rows_come_back_exactly_from_the_packed_weight(kind):
    raw = random_blocks(kind, rows=200, cols=256)  # 200 rows: three whole 64-row blocks and a tail
    codes = decode_blocks(raw, kind)
    matrix = Int4Matrix(codes, lookup=True)
    ids = torch.tensor([0, 5, 63, 64, 127, 191, 192, 199, 5])
    assert torch.equal(matrix.rows(ids), codes.dequantize()[ids])


def test_real_blocks_of_the_embedded_model(smollm2_gguf):
    """SmolLM2's own Q4_1 projection and Q8_0 embedding/LM head, straight from the file."""
    reader = GGUFReader(smollm2_gguf)
    tensors = {t.name: t for t in reader.tensors}
    for name, kind in [
        ("blk.0.ffn_down.weight", T.Q4_1),
        ("blk.3.attn_q.weight", T.Q4_1),
        ("token_embd.weight", T.Q8_0),
    ]:
        tensor = tensors[name]
        assert tensor.tensor_type == kind
        raw = np.asarray(tensor.data)
        if name == "token_embd.weight":
            raw = raw[:4096]  # the first 4096 vocabulary rows keep the test quick
        codes = decode_blocks(raw, kind, tensor_name=name)
        weight = codes.dequantize()
        assert torch.equal(weight, torch.from_numpy(quants.dequantize(raw, kind)))
        matrix = Int4Matrix(codes, lookup=kind == T.Q8_0)
        assert_kernel_matches(matrix, weight, rows=3)
        if kind == T.Q8_0:
            ids = torch.tensor([0, 1, 2, 100, 4095])
            assert torch.equal(matrix.rows(ids), weight[ids])


def test_int8_per_channel_kernel_and_its_quantization_error():
    torch.manual_seed(1)
    weight = torch.randn(96, 256)
    matrix = quantize_int8(weight)
    dequantized = matrix.dequantize()
    step = weight.abs().amax(dim=1, keepdim=True) / 127
    assert bool(((dequantized - weight).abs() <= step / 2 + 1e-6).all())
    for rows in (1, 16):
        assert_kernel_matches(matrix, dequantized, rows=rows)
    assert torch.equal(matrix.rows(torch.tensor([3, 0])), dequantized[[3, 0]])


def test_int4_per_group_kernel_and_its_quantization_error():
    torch.manual_seed(2)
    weight = torch.randn(64, 256)
    codes = quantize_int4(weight)
    dequantized = codes.dequantize()
    step = codes.scale.repeat_interleave(32, dim=1)
    assert bool(((dequantized - weight).abs() <= step / 2 + 1e-6).all())
    for rows in (1, 16):
        assert_kernel_matches(Int4Matrix(codes), dequantized, rows=rows)


def test_rows_not_a_multiple_of_the_kernel_tile_are_padded():
    codes = decode_blocks(random_blocks(T.Q4_0, rows=40, cols=64), T.Q4_0)
    assert_kernel_matches(Int4Matrix(codes), codes.dequantize(), rows=2)


def test_an_unsupported_block_type_is_refused_by_name():
    _, nbytes = GGML_QUANT_SIZES[T.IQ4_NL]
    raw = np.zeros((4, 2 * nbytes), dtype=np.uint8)
    with pytest.raises(
        UnsupportedBlockType, match=r"blk\.0\.attn_q\.weight uses GGUF block type IQ4_NL.*supported: Q4_0"
    ):
        decode_blocks(raw, T.IQ4_NL, tensor_name="blk.0.attn_q.weight")


def test_affine_codes_rows_equal_the_full_dequantization():
    codes = decode_blocks(random_blocks(T.Q5_1, rows=8, cols=64), T.Q5_1)
    assert isinstance(codes, AffineCodes)
    assert torch.equal(codes.rows(torch.tensor([7, 2])), codes.dequantize()[[7, 2]])
