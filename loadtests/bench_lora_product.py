"""Which phrasing of the batched LoRA product is fastest here (the figures in ``decoding/model/lora/product.py``).

One step's worth of SmolLM2-135M's projections (30 layers x q/k/v/o/gate/up/down), every one with a
LoRA delta, rank 16, float32, for steps of several shapes: tokens spread evenly over 4 resident
adapters and the base (index 0), a prompt chunk of 4 runs (one adapter each), one adapter's run and
one base token; beside them the base products themselves (oneDNN-packed, as served), so the delta's
share is visible, and the one-adapter product (every token on adapter 1: one client). ``stacked``
and ``padded`` leave the zero adapter out, as the bank does; ``native`` is ``low_rank.cpp``'s one call
(every token's delta against its own adapter, a base token skipped).

    .venv/bin/python -m loadtests.bench_lora_product [--rank 16] [--adapters 4]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from decoding.model.lora import native
from decoding.model.lora.product import add_padded, add_single, add_stacked, gathered_delta, grouped_delta

LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
SHAPES = LAYER * 30
Mats = list[tuple]  # (width, a, b, a_cat, b_cat, packed base, a stack, b stack) per projection


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
        a_cat = a[1:].permute(1, 0, 2).reshape(inp, (slots - 1) * rank).contiguous()  # no zero adapter
        b_cat = b[1:].reshape((slots - 1) * rank, out).contiguous()
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.randn(out, inp), 64)
        mats.append((inp, a, b, a_cat, b_cat, packed, a[1:].contiguous(), b[1:].contiguous()))
    return mats


def _row(index: torch.Tensor, mats: Mats, scale: torch.Tensor, rank: int) -> list[float]:
    tokens, slots = index.shape[0], scale.shape[0]
    present = sorted(set(index.tolist()) - {0})
    mask = torch.zeros(tokens, slots, 1)
    mask[torch.arange(tokens), index, 0] = scale[index]
    mask = mask[:, 1:].contiguous()  # the stack has no zero adapter
    groups = [(index == slot).nonzero().squeeze(1).tolist() for slot in range(1, slots)]
    width = max(len(group) for group in groups)
    gather = torch.tensor([t for group in groups for t in group + [0] * (width - len(group))])
    scales = [[float(scale[s + 1])] * len(g) + [0.0] * (width - len(g)) for s, g in enumerate(groups)]
    padded_mask = torch.tensor(scales).view(slots - 1, width, 1)
    rows = torch.tensor([s * width + i for s, group in enumerate(groups) for i in range(len(group))])
    owners = torch.tensor([t for group in groups for t in group], dtype=torch.long)
    xs = {i: torch.randn(tokens, i) for i in (576, 1536)}
    outs = {o: torch.zeros(tokens, o) for o in (192, 576, 1536)}

    def base() -> None:
        for inp, _, _, _, _, packed, *_ in mats:
            torch.ops.mkldnn._linear_pointwise(xs[inp], packed, None, "none", [], "")

    def stacked() -> None:
        for inp, _, b, a_cat, b_cat, *_ in mats:
            add_stacked(outs[b.shape[-1]], xs[inp], a_cat, b_cat, mask, rank)

    def padded() -> None:
        for inp, a, b, *_ in mats:
            add_padded(outs[b.shape[-1]], xs[inp], a[1:], b[1:], gather, padded_mask, rows, owners)

    def gathered() -> None:
        for inp, a, b, *_ in mats:
            gathered_delta(xs[inp], a, b, scale, index)

    def grouped() -> None:
        for inp, a, b, *_ in mats:
            grouped_delta(xs[inp], a, b, scale, index, present)

    def single() -> None:  # every token on adapter 1: what one client with an adapter runs
        for inp, a, b, *_ in mats:
            add_single(outs[b.shape[-1]], xs[inp], a[1], b[1], 2.0)

    token_slots = index - 1  # the native kernel's stack has no zero adapter: -1 is the base
    stack_scales = scale[1:].contiguous()

    def one_call() -> None:  # low_rank.cpp: both products of every token in one call
        for inp, _, b, _, _, _, a_stack, b_stack in mats:
            native.add_deltas(outs[b.shape[-1]], xs[inp], a_stack, b_stack, token_slots, stack_scales)

    functions = [base, stacked, padded, gathered, grouped, single]
    return [_time(f) for f in functions] + [_time(one_call) if native.available() else float("nan")]


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
    print(f"rank {args.rank}, {args.adapters} adapters + base, {torch.get_num_threads()} threads; best ms for one "
          f"step's 210 projections")  # fmt: skip
    names = ("base", "stacked", "padded", "gathered", "grouped", "1 adapter", "native")
    print(f"{'step':<24}" + " ".join(f"{name:>9}" for name in names))
    for label, index in _steps(slots):
        row = _row(index, mats, scale, args.rank)
        print(f"{label:<24}" + " ".join(f"{v:>9.2f}" for v in row))


def _steps(slots: int) -> list[tuple[str, torch.Tensor]]:
    """The step shapes timed: each token's adapter index (0: the base)."""
    spread = lambda tokens: torch.arange(tokens) % slots  # noqa: E731
    runs = torch.arange(320) * (slots - 1) // 320 + 1  # a prompt chunk: 4 prompts of 80, one adapter each
    one_and_base = torch.tensor([1] * 20 + [0])
    return [
        ("1, adapter 1", torch.ones(1, dtype=torch.long)),
        ("4, spread", spread(4)),
        ("16, spread", spread(16)),
        ("32, spread", spread(32)),
        ("64, spread", spread(64)),
        ("320, 4 runs of 80", runs),
        ("21, adapter 1 + base", one_and_base),
        ("64, adapter 1", torch.ones(64, dtype=torch.long)),
    ]


if __name__ == "__main__":
    main()
