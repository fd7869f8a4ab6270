"""``--dtype auto`` follows what the CPU reports, never the developer's machine."""

from __future__ import annotations

import pytest
import torch

from decoding.model import dtype_choice


@pytest.mark.parametrize(
    ("amx", "avx512_bf16", "expected"),
    [(False, False, "float32"), (False, True, "bfloat16"), (True, False, "bfloat16"), (True, True, "bfloat16")],
)
def test_auto_picks_bfloat16_only_with_native_bf16_dot_products(monkeypatch, amx, avx512_bf16, expected):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    dtype, why = dtype_choice.resolve_dtype("auto", "cpu")
    assert dtype == expected and why.startswith("auto:")
    if expected == "bfloat16":
        assert ("amx" if amx else "avx512_bf16") in why


def test_a_named_dtype_is_kept():
    assert dtype_choice.resolve_dtype("float16", "cpu") == ("float16", "as configured")
