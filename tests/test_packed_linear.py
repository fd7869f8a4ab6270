"""Which linears ``pack_linears`` replaces, and that each still computes ``F.linear``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from decoding.model.packed_linear import PackedLinear, SharedWeightLinear, pack_linears
from tests.engine_harness import tiny_llama


@pytest.mark.parametrize("rows", [1, 2, 7])
def test_a_tied_float32_head_shares_the_embedding_and_computes_its_product(rows):
    model = tiny_llama(512, seed=3)
    weight = model.lm_head.weight.detach().clone()
    pack_linears(model)
    head = model.lm_head
    assert isinstance(head, SharedWeightLinear)
    assert head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # no copy of the largest matrix
    hidden = torch.randn(1, rows, model.config.hidden_size)
    with torch.inference_mode():
        out = head(hidden)
    assert out.shape == (1, rows, 512) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(hidden, weight), rtol=1e-5, atol=1e-5)
    mlp = model.model.layers[0].mlp
    assert all(isinstance(linear, PackedLinear) for linear in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))


def test_a_bfloat16_tied_head_stays_a_plain_linear():
    """bfloat16's F.linear is already as fast as the weight-major product (module docstring)."""
    model = tiny_llama(512, seed=3).to(torch.bfloat16)
    pack_linears(model)
    assert type(model.lm_head) is torch.nn.Linear


def test_a_large_tied_head_times_both_forms_and_each_computes_the_product():
    """A head of 16 MiB or more is timed at load for each row bucket (which form wins depends on the
    CPU); whichever form a bucket takes, the product is ``F.linear``'s."""
    linear = torch.nn.Linear(512, 8192, bias=False)
    head = SharedWeightLinear(linear)
    head.calibrate()
    assert set(head.row_form) == {1, 2, 4, 8, 16, 32}
    for rows in (1, 3, 8, 40):  # 40 rows take the largest bucket's form
        hidden = torch.randn(1, rows, 512)
        expected = F.linear(hidden, linear.weight)
        for row_form in (True, False):
            head.row_form = dict.fromkeys(head.row_form, row_form)
            with torch.inference_mode():
                out = head(hidden)
            assert out.shape == (1, rows, 8192) and out.is_contiguous()
            torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


def test_a_small_tied_head_is_not_timed():
    head = SharedWeightLinear(torch.nn.Linear(64, 512))
    head.calibrate()
    assert head.row_form == {}
