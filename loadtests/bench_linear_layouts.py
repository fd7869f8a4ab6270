"""How fast each phrasing of a float32 linear runs on this CPU, per number of tokens.

Times one decode step's worth of SmolLM2-135M's linear shapes (30 layers x 7 projections plus the
49152x576 LM head) with random weights; the figures behind ``decoding/model/packed_linear.py``. Then
the LM head alone, as a tied head multiplies (its weight is the embedding's, so it is not packed):
``F.linear`` against ``SharedWeightLinear`` (``W @ x.T``, one row doubled).

    .venv/bin/python -m loadtests.bench_linear_layouts
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from decoding.model.packed_linear import SharedWeightLinear

LAYER = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
SHAPES = LAYER * 30 + [(49152, 576)]


def main() -> None:
    weights = [torch.randn(o, i) for o, i in SHAPES]
    transposed = [w.t().contiguous() for w in weights]
    # oneDNN's blocked layout, packed once for a batch hint (what decoding/weight_layout.py uses)
    packed = {id(w): torch.ops.mkldnn._reorder_linear_weight(w, 64) for w in weights}
    modes = {
        "F.linear(x, W)": lambda x, w, wt: F.linear(x, w),
        "x @ W_t": lambda x, w, wt: x @ wt,
        "(W @ x.T).T": lambda x, w, wt: (w @ x.t()).t().contiguous(),
        "oneDNN packed": lambda x, w, wt: torch.ops.mkldnn._linear_pointwise(x, packed[id(w)], None, "none", [], ""),
    }
    print(f"{'tokens':>6}  " + "  ".join(f"{m:>16}" for m in modes))
    for tokens in (1, 2, 4, 8, 16, 32, 64, 128, 512):
        inputs = {i: torch.randn(tokens, i) for i in (576, 1536)}
        row = []
        for fn in modes.values():

            def step(fn=fn, inputs=inputs) -> None:  # noqa: ANN001
                for (_, i), w, wt in zip(SHAPES, weights, transposed, strict=True):
                    fn(inputs[i], w, wt)

            step()
            start = time.perf_counter()
            for _ in range(3):
                step()
            row.append((time.perf_counter() - start) / 3 * 1000)
        print(f"{tokens:>6}  " + "  ".join(f"{ms:>13.1f} ms" for ms in row))
    head_table()


def head_table() -> None:
    """The 49152x576 float32 LM head by itself: ``F.linear`` and ``SharedWeightLinear``."""
    linear = torch.nn.Linear(576, 49152, bias=False)
    shared = SharedWeightLinear(linear)
    print(f"\nLM head 49152x576 alone\n{'tokens':>6}  {'F.linear':>16}  {'SharedWeightLinear':>20}")
    with torch.inference_mode():
        for tokens in (1, 2, 4, 16, 64):
            x = torch.randn(tokens, 576)
            row = []
            for fn in (lambda: F.linear(x, linear.weight), lambda: shared(x)):  # noqa: B023
                fn()
                start = time.perf_counter()
                for _ in range(10):
                    fn()
                row.append((time.perf_counter() - start) / 10 * 1000)
            print(f"{tokens:>6}  {row[0]:>13.1f} ms  {row[1]:>17.1f} ms")


if __name__ == "__main__":
    main()
