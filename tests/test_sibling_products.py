"""Sibling linears stacked into one block matrix (``sibling_products``) give each linear's own product.

Every part must equal, bit for bit, what its own ``BlockMatrix`` computes (a row's result depends
only on that row of weights and the input), whether the part is cut from the previous call's product
(same input) or computes the whole product (another input, or the first call)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from decoding.model.quantization import block_matrix
from decoding.model.quantization.affine import AffineCodes
from decoding.model.quantization.block_matrix import BlockMatrix
from decoding.model.quantization.modules import QuantizedLinear
from decoding.model.quantization.sibling_products import BlockMatrixPart, fuse_sibling_products

pytestmark = pytest.mark.skipif(not block_matrix.available(), reason="no AVX2 / AVX-512 VNNI build of the kernel here")


def block_linear(out_features: int, in_features: int, seed: int, half_scales: bool = True) -> QuantizedLinear:
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (out_features, in_features), generator=generator, dtype=torch.uint8)
    scale = torch.rand(out_features, in_features // 32, generator=generator) * 0.02
    offset = -torch.rand(out_features, in_features // 32, generator=generator) * 0.1
    if half_scales:  # GGUF's fp16 fields: kept as float16 by BlockMatrix
        scale, offset = scale.half().float(), offset.half().float()
    affine = AffineCodes(codes=codes, scale=scale, offset=offset, zero_code=None, group_size=32, bits=4)
    return QuantizedLinear(BlockMatrix(affine), None, "test Q4_1")


def attention_like(half_scales_of_v: bool = True) -> nn.Module:
    module = nn.Module()
    module.q_proj, module.k_proj = block_linear(96, 128, 1), block_linear(32, 128, 2)
    module.v_proj = block_linear(32, 128, 3, half_scales=half_scales_of_v)
    module.o_proj = block_linear(128, 96, 4)
    return module


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("half_scales_of_v", [True, False])
def test_each_part_equals_its_own_matrix(dtype, rows, half_scales_of_v):
    module = attention_like(half_scales_of_v)
    names = ("q_proj", "k_proj", "v_proj")
    x, other = torch.randn(rows, 128).to(dtype), torch.randn(rows, 128).to(dtype)
    with torch.inference_mode():
        expected = {name: getattr(module, name)(x) for name in names}
        expected_other = {name: getattr(module, name)(other) for name in names}
        assert fuse_sibling_products(module) == 1
        parts = [getattr(module, name).matrix for name in names]
        assert all(isinstance(part, BlockMatrixPart) for part in parts)
        assert len({part.codes.data_ptr() for part in parts}) == 1  # one stacked matrix, no copies
        assert type(module.o_proj.matrix) is BlockMatrix  # not a sibling
        for name in names:  # in order: q computes the stacked product, k and v cut theirs from it
            assert torch.equal(getattr(module, name)(x), expected[name])
        for name in reversed(names):  # another input, then the first again: recomputed each time it changes
            assert torch.equal(getattr(module, name)(other), expected_other[name])
            assert torch.equal(getattr(module, name)(x), expected[name])


def test_parts_keep_their_weights_and_sizes():
    module = attention_like()
    dense = {name: getattr(module, name).matrix.dequantize() for name in ("q_proj", "k_proj", "v_proj")}
    nbytes = sum(getattr(module, name).matrix.nbytes() for name in dense)
    fuse_sibling_products(module)
    for name, weight in dense.items():
        part = getattr(module, name).matrix
        assert (part.out_features, part.in_features) == tuple(weight.shape)
        assert torch.equal(part.dequantize(), weight)
    assert sum(getattr(module, name).matrix.nbytes() for name in dense) == nbytes


def test_linears_of_other_widths_are_left_alone():
    module = attention_like()
    module.k_proj = block_linear(32, 96, 2)  # reads another width: not a sibling of q and v
    assert fuse_sibling_products(module) == 0
    assert type(module.q_proj.matrix) is BlockMatrix
