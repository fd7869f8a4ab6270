"""The one-call LoRA delta of a few tokens (``low_rank.cpp``, which says why), built on first use.

Built like the other native kernels (``decoding.kv.native_kernel``); where it cannot be built, or the
model does not compute in float32 on a CPU, the bank keeps its ``torch.mm`` products (``product``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from decoding.kv.native_kernel import build_once

SOURCE = Path(__file__).with_name("low_rank.cpp")

_ADD: list = []  # [torch.ops.decoda_lora.add_deltas.default] once loaded: skips the packet's lookup


def add_deltas(
    out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, token_slots: torch.Tensor,
    scales: torch.Tensor,
) -> None:  # fmt: skip
    """``out[t] += scales[s] * x[t] @ a[s] @ b[s]`` in place, ``s = token_slots[t]`` (-1: no delta)."""
    _ADD[0](out, x, a, b, token_slots, scales)


def serves(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the kernel runs here: a CPU, float32, and the operator built."""
    return device.type == "cpu" and dtype == torch.float32 and available()


def _register() -> None:
    _ADD.append(torch.ops.decoda_lora.add_deltas.default)


available = build_once(
    SOURCE, "low_rank", _register, "LoRA kernel unavailable: adapters' deltas use torch.mm at every step"
)
