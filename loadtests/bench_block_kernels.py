"""The GGUF block kernels on Qwen2.5-Coder-1.5B's shapes against this machine's memory bandwidth.

For each of the model's weight shapes (the 8960x1536 gate/up and 1536x8960 down of the MLP, the
1536x1536 query/output and 256x1536 key/value projections, the 151,936x1536 head), in the file's own
types (Q4_K; Q6_K for half the layers' down and value, and the head), times one product at 1 and 8
activation rows and at a prompt's 512, on:

- ``ktile``: the tiled K-quant kernel (``ktile_matrix``, what ``--quantization gguf`` serves now);
- ``before``: what served the same blocks before it (``BlockMatrix`` with a float32 scale and minimum
  per 32 columns for Q4_K; Q6_K on ``BlockMatrix`` with AVX-512 VNNI, else PyTorch's int4 kernel);
- ``float``: the dequantized float32 weights through ``torch.mm`` (oneDNN/MKL), the prompt's reference.

Weight GB/s is the file's bytes of the tensor over the product's time, beside what this machine
streams: a ``torch.sum`` over 512 MB (read) and a 512 MB ``copy_`` (read + write, counted twice).
A step's total weighs each shape by its count in the model (28 layers). Timings are medians; run it
when nothing else is busy (``uptime``, ``/proc/pressure/cpu``): one other busy process on a 2-core
machine leaves a thread of every product waiting for a core, and the times jump to the scheduler's
slices; ``--threads 1`` is then the steadier figure.

    .venv/bin/python -m loadtests.bench_block_kernels [--gguf PATH] [--repeats 15] [--prompt 512] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType

from decoding.model.quantization import block_matrix, ktile_matrix
from decoding.model.quantization.block_matrix import BlockMatrix
from decoding.model.quantization.gguf_blocks import decode_blocks
from decoding.model.quantization.gguf_index import GgufIndex
from decoding.model.quantization.int4_matrix import Int4Matrix
from decoding.model.quantization.ktile_matrix import KTileMatrix

DEFAULT_GGUF = Path("/work/models/qwen2.5-coder-1.5b-q4_k_m.gguf")
# (GGUF tensor, how many of its kind a step multiplies): layer 0 holds the Q6_K down/value, layer 1 the Q4_K ones
SHAPES = [
    ("blk.0.ffn_gate.weight", 56),  # gate and up, 28 layers each
    ("blk.0.ffn_down.weight", 14),
    ("blk.1.ffn_down.weight", 14),
    ("blk.0.attn_q.weight", 56),  # query and output
    ("blk.0.attn_k.weight", 28),
    ("blk.0.attn_v.weight", 14),
    ("blk.1.attn_v.weight", 14),
    ("output.weight", 1),
]
CPU_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "amx_int8")


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cpu_summary() -> str:
    flags: set[str] = set()
    model = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags") and not flags:
            flags = set(line.split(":", 1)[1].split())
        elif line.startswith("model name") and model == "?":
            model = line.split(":", 1)[1].strip()
    present = " ".join(flag for flag in CPU_FLAGS if flag in flags)
    absent = " ".join(flag for flag in CPU_FLAGS if flag not in flags)
    return f"{model}, {torch.get_num_threads()} threads; flags: {present} (not: {absent or '-'})"


def bandwidth(repeats: int) -> tuple[float, float]:
    """(read GB/s, copy GB/s counting read and write) over 512 MB."""
    source = torch.ones(128 << 20, dtype=torch.float32)
    target = torch.empty_like(source)
    size = source.numel() * 4
    read = size / median_seconds(lambda: source.sum(), repeats) / 1e9
    copy = 2 * size / median_seconds(lambda: target.copy_(source), repeats) / 1e9
    return read, copy


def before_matrix(blocks: object) -> tuple[object, torch.dtype]:
    """The matrix that served these blocks before the tiled kernel, and the input dtype it takes."""
    if block_matrix.fits(blocks):  # type: ignore[arg-type]
        return BlockMatrix(blocks), torch.float32  # type: ignore[arg-type]
    return Int4Matrix(blocks), torch.bfloat16  # type: ignore[arg-type]


def measure(tensor: object, count: int, rows_list: list[int], read: float, args: argparse.Namespace,
            totals: dict[tuple[str, int], float]) -> list[str]:  # fmt: skip
    """One tensor's lines, adding its time times ``count`` to ``totals[(kernel, rows)]``."""
    kind = GGMLQuantizationType(tensor.tensor_type)  # type: ignore[attr-defined]
    raw = np.asarray(tensor.data)  # type: ignore[attr-defined]
    blocks = decode_blocks(raw, kind)
    tiled = KTileMatrix(blocks)
    before, before_dtype = (None, None) if args.no_before else before_matrix(blocks)
    dense = None
    out_features, in_features = blocks.shape
    lines = []
    for rows in rows_list:
        if rows >= 64 and tensor.name == "output.weight":  # type: ignore[attr-defined]
            continue  # a prompt needs logits of its last position only
        x = torch.randn(rows, in_features)
        seconds = median_seconds(lambda x=x: tiled.matmul(x), args.repeats if rows < 64 else 3)
        totals[("ktile", rows)] = totals.get(("ktile", rows), 0.0) + count * seconds
        line = (
            f"{tensor.name:<22} {kind.name:<5} {out_features:>5}x{in_features:<6} {raw.nbytes / 1e6:>6.1f} "  # type: ignore[attr-defined]
            f"{rows:>4}  {seconds * 1e3:>9.3f} {raw.nbytes / seconds / 1e9:>5.1f} "
            f"{raw.nbytes / seconds / 1e9 / read:>5.0%}"
        )
        if before is not None:
            xb = x.to(before_dtype)
            old = median_seconds(lambda xb=xb: before.matmul(xb), args.repeats if rows < 64 else 2)
            totals[("before", rows)] = totals.get(("before", rows), 0.0) + count * old
            line += f"  {old * 1e3:>9.3f} {raw.nbytes / old / 1e9:>5.1f}"
        else:
            line += f"  {'-':>9} {'-':>5}"
        if rows >= 64:
            dense = tiled.dequantize() if dense is None else dense
            flt = median_seconds(lambda x=x, dense=dense: torch.mm(x, dense.t()), 3)
            totals[("float", rows)] = totals.get(("float", rows), 0.0) + count * flt
            line += f"  {flt * 1e3:>8.2f}"
        lines.append(line)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--prompt", type=int, default=512, help="rows of the prompt-sized product (0: skip)")
    parser.add_argument("--no-before", action="store_true", help="skip the previous kernels (slow at 512 rows)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(cpu_summary())
    print(f"kernels: ktile {ktile_matrix.isa()}, block {block_matrix.isa()}")
    read, copy = bandwidth(max(3, args.repeats // 3))
    print(f"memory: read {read:.1f} GB/s (torch.sum over 512 MB), copy {copy:.1f} GB/s (read + write)\n")
    index = GgufIndex(args.gguf)
    tensors = {t.name: t for t in index.tensors}
    rows_list = [1, 8] + ([args.prompt] if args.prompt else [])
    print(
        f"{'tensor':<22} {'type':<5} {'out x in':>12} {'MB':>6} {'rows':>4}  {'ktile ms':>9} {'GB/s':>5} "
        f"{'%read':>5}  {'before ms':>9} {'GB/s':>5}  {'float ms':>8}"
    )
    totals: dict[tuple[str, int], float] = {}
    for name, count in SHAPES:
        for line in measure(tensors[name], count, rows_list, read, args, totals):
            print(line)
    print("\na step's weights (each shape times its count; the head at every row, as a decode step needs):")
    for rows in rows_list:
        parts = [f"{kernel} {totals[(kernel, rows)] * 1e3:8.1f} ms" for kernel in ("ktile", "before", "float")
                 if (kernel, rows) in totals]  # fmt: skip
        print(f"  {rows:>4} rows: " + ", ".join(parts) + ("  (without the head)" if rows >= 64 else ""))


if __name__ == "__main__":
    main()
