"""4-bit weights multiplied by int8-quantized activations in a native operator (``q4_gemv.cpp``).

At one token a step is bound by streaming the weights; PyTorch's int4 kernel widens each weight
to bfloat16 first and reaches about half the memory bandwidth on a small model's matrices. This
matrix keeps GGUF's own 4-bit layout (two codes a byte, a scale and a minimum per 32 columns) and
multiplies with integer dot products against activations quantized per 32-column block to int8,
as llama.cpp multiplies Q4_1 by Q8_1 (``loadtests/bench_q4_gemv.py`` measures both kernels).

The operator is built with the system C++ compiler against the installed torch on first use
(cached like the paged-attention kernel, ``decoding.kv.native_kernel``) for this CPU, and picks its
instructions from what the compiler targets: AVX-512 VNNI, else AVX2. Where neither is available,
or the build fails, ``available()`` is False and the caller keeps ``Int4Matrix``.

Error: each activation is rounded to its block's int8 grid (at most ``max|x_block| / 254``), the
rest is float32 arithmetic (``tests/test_q4_matrix.py`` states and checks the bound). Scales and
minimums are kept as float16 when that is exact (GGUF's Q4_0 and Q4_1 store them so), else float32.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import torch

from decoding.kv.native_kernel import build_and_load, cpu_id
from decoding.model.quantization.affine import AffineCodes
from decoding.model.quantization.matrix_base import MatrixModule

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("q4_gemv.cpp")
BLOCK = 32
ISA_NAMES = {2: "AVX-512 VNNI", 1: "AVX2"}

_state: list[int | None] = []  # [isa] once loaded, [None] when unavailable
_LINEAR: list = []  # [torch.ops.decoda_q4.linear.default] once loaded


class Q4Matrix(MatrixModule):
    """``matmul(x) = x @ W.T`` for ``x`` in float32 or bfloat16, returned in ``x``'s dtype."""

    input_dtypes = (torch.float32, torch.bfloat16)

    def __init__(self, weight: AffineCodes) -> None:
        super().__init__()
        if not available():
            raise RuntimeError("the q4 kernel is not built on this machine (check q4_matrix.available() first)")
        if not fits(weight):
            raise ValueError(f"{weight.bits}-bit codes in groups of {weight.group_size} are not Q4 blocks")
        self.out_features, self.in_features = weight.shape
        repeat = weight.group_size // BLOCK
        scale = weight.scale.repeat_interleave(repeat, dim=1)
        offset = weight.offsets().repeat_interleave(repeat, dim=1)
        self.keep("codes", pack_blocks(weight.codes))
        dtype = torch.float16 if _exact_in_half(scale) and _exact_in_half(offset) else torch.float32
        self.keep("scales", scale.to(dtype).contiguous())
        self.keep("mins", offset.to(dtype).contiguous())
        # the same tensors as a plain tuple: an eager call skips three nn.Module attribute lookups
        # (~0.9 us each, 210 linears a step); a compiled graph reads the buffers (shared graph inputs)
        self._operands = (self.codes, self.scales, self.mins)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return torch.ops.decoda_q4.linear(x, self.codes, self.scales, self.mins)
        return _LINEAR[0](x, *self._operands)

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202
        """Keep the eager tuple pointing at the buffers when ``.to()`` replaces them."""
        module = super()._apply(fn, recurse)
        self._operands = (self.codes, self.scales, self.mins)
        return module

    def dequantize(self) -> torch.Tensor:
        """The float32 weights this matrix multiplies by (exactly the codes it was given)."""
        low, high = self.codes & 0x0F, self.codes >> 4
        blocks = torch.cat([low.reshape(self.out_features, -1, 16), high.reshape(self.out_features, -1, 16)], dim=2)
        codes = blocks.reshape(self.out_features, self.in_features).float()
        expand = lambda t: t.float().repeat_interleave(BLOCK, dim=1)  # noqa: E731
        return expand(self.scales) * codes + expand(self.mins)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.mins))


def fits(weight: AffineCodes) -> bool:
    """Codes of at most 4 bits whose groups are whole 32-column blocks."""
    return weight.bits <= 4 and weight.group_size % BLOCK == 0 and weight.shape[1] % BLOCK == 0


def pack_blocks(codes: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` codes in [0, 16) → ``[N, K / 2]`` uint8, ggml's order: byte i of a block holds
    column i (low nibble) and column i + 16 (high nibble)."""
    blocks = codes.to(torch.uint8).reshape(codes.shape[0], -1, 2, 16)
    return (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(codes.shape[0], -1).contiguous()


def available() -> bool:
    """True when the operator is built and uses integer dot products on this CPU."""
    return isa() is not None


def isa() -> str | None:
    """The instruction set the operator uses here ("AVX-512 VNNI", "AVX2"), None when it is not used."""
    if not _state:
        _state.append(_load())
    return ISA_NAMES.get(_state[0]) if _state[0] is not None else None


def _exact_in_half(values: torch.Tensor) -> bool:
    return bool(torch.equal(values.to(torch.float16).float(), values.float()))


def _load() -> int | None:
    if os.environ.get("DECODA_Q4_KERNEL") == "torch":
        return None
    include = Path(torch.__file__).parent / "include"
    library_dir = Path(torch.__file__).parent / "lib"
    march = os.environ.get("DECODA_KERNEL_MARCH", "native")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    flags = [
        "-O3", f"-march={march}", "-fopenmp", "-fPIC", "-shared", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-I{include}", f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}", "-w",
    ]  # fmt: skip
    libraries = (f"-L{library_dir}", f"-Wl,-rpath,{library_dir}", "-lc10", "-ltorch_cpu")
    machine = cpu_id() if march == "native" else march.encode()
    key = SOURCE.read_bytes() + " ".join(flags).encode() + machine + torch.__version__.encode()
    name = f"q4_gemv-{hashlib.sha256(key).hexdigest()[:16]}.so"
    path = build_and_load(SOURCE, flags, name, load=_load_operators, compiler=("CXX", "g++"), libraries=libraries)
    if path is None:
        logger.warning("q4 kernel unavailable: 4-bit weights use PyTorch's int4 kernel (slower at one token)")
        return None
    level = int(torch.ops.decoda_q4.isa())
    if level == 0:
        logger.info("q4 kernel built without AVX2 or AVX-512 VNNI: 4-bit weights use PyTorch's int4 kernel")
        return None
    logger.info("q4 kernel: %s integer dot products", ISA_NAMES[level])
    return level


def _load_operators(path: str) -> str:
    torch.ops.load_library(path)
    torch.library.register_fake("decoda_q4::linear", _linear_shape)  # what the compiler traces
    _LINEAR.append(torch.ops.decoda_q4.linear.default)
    return path


def _linear_shape(x, codes, scales, mins):  # noqa: ANN001, ANN202
    return x.new_empty((x.shape[0], codes.shape[0]))
