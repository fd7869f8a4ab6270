"""``--dtype auto``: bfloat16 where the hardware multiplies it natively, float32 elsewhere.

bfloat16 halves the bytes every decode step reads and, on a CPU with bf16 dot products
(AVX-512 BF16 or AMX tiles, as the CPU reports them through torch's own ISA probes), runs the
matmuls at about twice float32's rate. Without them oneDNN emulates bf16 through float32 and is
slower than float32 itself, so ``auto`` never picks it there. The default stays float32: it is
the dtype HF's reference tokens are checked against; ``auto`` is the fast choice, and the start
log says which dtype it became and why.
"""

from __future__ import annotations

import torch


def cpu_bf16_isa() -> str | None:
    """The CPU's native bf16 instruction set, or None."""
    if torch.cpu._is_amx_tile_supported():
        return "amx"
    if torch.cpu._is_avx512_bf16_supported():
        return "avx512_bf16"
    return None


def resolve_dtype(dtype: str, device: str) -> tuple[str, str]:
    """``(dtype, why)``: ``auto`` resolved for ``device``; any other name is returned as given."""
    if dtype != "auto":
        return dtype, "as configured"
    kind = torch.device(device).type
    if kind == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bfloat16", "auto: the GPU has bfloat16 arithmetic"
        return "float16", "auto: the GPU has no bfloat16 arithmetic"
    isa = cpu_bf16_isa()
    if kind == "cpu" and isa is not None:
        return "bfloat16", f"auto: the CPU has native bf16 dot products ({isa})"
    return "float32", "auto: the CPU has no native bf16 dot products (avx512_bf16 or amx), float32 is faster"
