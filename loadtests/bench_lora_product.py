"""Which phrasing of the batched LoRA product is fastest here (the figures in ``decoding/model/lora/product.py``).

One step's worth of SmolLM2-135M's projections (30 layers x q/k/v/o/gate/up/down), every one with a
LoRA delta, tokens spread evenly over 4 resident adapters and the base (index 0), rank 16, float32;
beside them the base products themselves (oneDNN-packed, as served), so the delta's share is visible,
and the one-adapter product (every token on one adapter: one client).

    .venv/bin/python -m loadtests.bench_lora_product [--rank 16] [--adapters 4]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from decoding.model.lora.product import add_single, add_stacked, gathered_delta, grouped_delta

LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
SHAPES = LAYER * 30
Mats = list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]


def _time(fn: Callable[[], None], repeat: int = 9) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best * 1000


def _matrices(slots: int, rank: int) -> Mats:
    mats = []
    for out, inp in SHAPES:
        a = torch.randn(slots, inp, rank) * 0.01
        b = torch.randn(slots, rank, out) * 0.01
        a[0], b[0] = 0, 0
        a_cat = a.permute(1, 0, 2).reshape(inp, slots * rank).contiguous()
        b_cat = b.reshape(slots * rank, out).contiguous()
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.randn(out, inp), 64)
        mats.append((inp, a, b, a_cat, b_cat, packed))
    return mats


def _row(tokens: int, mats: Mats, scale: torch.Tensor, rank: int) -> list[float]:
    slots = scale.shape[0]
    index = torch.arange(tokens) % slots if tokens > 1 else torch.ones(1, dtype=torch.long)
    present = sorted(set(index.tolist()) - {0})
    mask = torch.zeros(tokens, slots, 1)
    mask[torch.arange(tokens), index, 0] = scale[index]
    xs = {i: torch.randn(tokens, i) for i in (576, 1536)}
    outs = {o: torch.zeros(tokens, o) for o in (192, 576, 1536)}

    def base() -> None:
        for inp, *_, packed in mats:
            torch.ops.mkldnn._linear_pointwise(xs[inp], packed, None, "none", [], "")

    def stacked() -> None:
        for inp, _, b, a_cat, b_cat, _ in mats:
            add_stacked(outs[b.shape[-1]], xs[inp], a_cat, b_cat, mask, rank)

    def gathered() -> None:
        for inp, a, b, *_ in mats:
            gathered_delta(xs[inp], a, b, scale, index)

    def grouped() -> None:
        for inp, a, b, *_ in mats:
            grouped_delta(xs[inp], a, b, scale, index, present)

    def single() -> None:  # every token on adapter 1: what one client with an adapter runs
        for inp, a, b, *_ in mats:
            add_single(outs[b.shape[-1]], xs[inp], a[1], b[1], 2.0)

    return [_time(f) for f in (base, stacked, gathered, grouped, single)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--adapters", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    slots = args.adapters + 1
    mats = _matrices(slots, args.rank)
    scale = torch.full((slots,), 2.0)
    scale[0] = 0
    print(f"rank {args.rank}, {args.adapters} adapters + base; best ms for one step's 210 projections")
    print(f"{'tokens':>6} {'base':>8} {'stacked':>8} {'gathered':>8} {'grouped':>8} {'1 adapter':>9}")
    for tokens in (1, 4, 16, 64, 256):
        row = _row(tokens, mats, scale, args.rank)
        print(f"{tokens:>6} " + " ".join(f"{v:>8.2f}" for v in row))


if __name__ == "__main__":
    main()
