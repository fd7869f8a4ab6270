"""Median decode-step time of the engine at 1 and 16 rows, per weight mode, in one process.

The figure issue 25's per-step profile asks for: the engine's own step (forward, sampling, stop
checks), no HTTP around it. Every row gets the same chat prompt and forced-length greedy tokens, so
steps differ only by the rows' lengths. Each comparison takes turns over three rounds in one
process, so the gain is read within a round: ``--ab-kernel`` builds a second engine whose GGUF/int4
weights take PyTorch's int4 kernel instead of the native block kernel; ``--ab-ktile`` one whose
K-quants (Q4_K, Q6_K) take what served them before the tiled kernel (the block kernel, or PyTorch's
int4 kernel for Q6_K without AVX-512 VNNI); ``--ab-fused`` times the same
engine with the PyTorch writes around the plain decode kernel instead of the fused K/V write +
decode attention call (``paged_write_decode``).

    .venv/bin/python -m loadtests.bench_step --modes float32,bfloat16,gguf,gguf+bfloat16 --ab-fused
    .venv/bin/python -m loadtests.bench_step --modes gguf --compile
    .venv/bin/python -m loadtests.bench_step --modes gguf,int4 --ab-kernel
    .venv/bin/python -m loadtests.bench_step --model gemma3-270m --modes gguf --compile
    .venv/bin/python -m loadtests.bench_step --model gemma3-270m --modes gguf --ab-ktile
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

import decoding.model.attention as attention
from decoding.engine.core import Engine
from decoding.model.loading import load_model
from decoding.model.quantization import block_matrix, ktile_matrix
from decoding.params import GenerationParams
from loadtests.bench_decode import PROMPT, build_engine, chat_prompt_ids
from loadtests.compare import cpu_summary

MODEL = "smollm2-135m-instruct"
FUSED = attention.paged_write_decode


def _unfused(*args: object, **kwargs: object) -> None:
    return None  # "cannot": _attend takes the PyTorch writes and the plain decode kernel


def build(mode: str, rows: int, compile_layers: bool, tokenizer: object, eos: list[int], model: str = MODEL) -> Engine:
    """``mode``: a weight format (float32, gguf, int8, int4), ``+bfloat16`` for bfloat16 activations."""
    weights, _, activations = mode.partition("+")
    config = ("bf16" if "bfloat16" in (weights, activations) else "fp32") + ("+compile" if compile_layers else "")
    quantization = weights if weights in ("gguf", "int8", "int4") else "none"
    return build_engine(model, config, tokenizer, eos, quantization=quantization, max_num_seqs=rows)


@contextmanager
def _without_block_kernel() -> Iterator[None]:
    """Engines built inside take PyTorch's int4 kernel for every block weight, as where block_dot.cpp cannot run."""
    saved = list(block_matrix._state)
    block_matrix._state[:] = [None]
    try:
        yield
    finally:
        block_matrix._state[:] = saved


@contextmanager
def _without_tiled_kernel() -> Iterator[None]:
    """Engines built inside serve K-quants as before the tiled kernel (``ktile_dot.cpp``)."""
    saved = list(ktile_matrix._state)
    ktile_matrix._state[:] = [None]
    try:
        yield
    finally:
        ktile_matrix._state[:] = saved


def median_step_ms(engine: Engine, prompt: list[int], rows: int, new_tokens: int) -> float:
    """Every step's time while ``rows`` requests of ``new_tokens`` forced tokens run; the median
    leaves out the prefill step(s)."""
    engine.emit = lambda output: None
    steps: list[float] = []
    with torch.inference_mode():
        for row in range(rows):
            params = GenerationParams(max_new_tokens=new_tokens, min_new_tokens=new_tokens, seed=row)
            engine.add_request(f"bench-{time.monotonic_ns()}-{row}", prompt, params)
        while engine.has_work():
            started = time.perf_counter()
            engine.step()
            steps.append(time.perf_counter() - started)
    return statistics.median(steps) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="float32,gguf", help="comma list: float32, bfloat16, gguf, "
                        "gguf+bfloat16, int8, int4 (+bfloat16)")  # fmt: skip
    parser.add_argument("--model", default=MODEL, help="a packaged model (gemma3-270m: the 262k-vocabulary one)")
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--compile", action="store_true", help="compile the forward as --compile does")
    parser.add_argument("--ab-fused", action="store_true", help="also time the unfused K/V write + attention")
    parser.add_argument("--ab-kernel", action="store_true", help="also time GGUF/int4 weights on PyTorch's "
                        "int4 kernel instead of the native block kernel (block_dot.cpp)")  # fmt: skip
    parser.add_argument("--ab-ktile", action="store_true", help="also time K-quants as served before the tiled "
                        "kernel (ktile_dot.cpp): the block kernel, or PyTorch's int4 kernel")  # fmt: skip
    args = parser.parse_args()
    if (args.ab_kernel or args.ab_ktile) and args.compile:
        parser.error(
            "--ab-kernel times two engines in one process, which --compile cannot (they would share "
            "one code object's graphs); compare two processes with DECODA_BLOCK_KERNEL=torch instead"
        )
    print(f"{cpu_summary()}; torch threads {torch.get_num_threads()}; {args.new_tokens} tokens a row")
    reference = load_model(args.model)  # its tokenizer and eos ids, as bench_decode hands them to each engine
    tokenizer, eos = reference.tokenizer, reference.eos_token_ids
    # Gemma's GGUF carries no chat template: the prompt's plain tokens then
    prompt = chat_prompt_ids(tokenizer) if tokenizer.chat_template else tokenizer(PROMPT).input_ids
    del reference
    for mode in args.modes.split(","):
        for rows in (int(r) for r in args.rows.split(",")):
            if args.compile:  # a new model: its graphs compile afresh, guards checked in full until its warm-up ends
                torch.compiler.set_stance("default")
                torch._dynamo.reset()
            engine = build(mode, rows, args.compile, tokenizer, eos, args.model)
            engines = {"fused": engine}
            if args.ab_fused:
                engines["unfused"] = engine  # the same engine, attention.paged_write_decode swapped
            if args.ab_kernel:
                with _without_block_kernel():
                    engines["int4 kernel"] = build(mode, rows, args.compile, tokenizer, eos, args.model)
            if args.ab_ktile:
                with _without_tiled_kernel():
                    engines["before ktile"] = build(mode, rows, args.compile, tokenizer, eos, args.model)
            for each in {id(e): e for e in engines.values()}.values():  # each engine once
                median_step_ms(each, prompt, rows, 16)  # warm
            times: dict[str, list[float]] = {name: [] for name in engines}
            for _ in range(3):
                for name, each in engines.items():
                    attention.paged_write_decode = _unfused if name == "unfused" else FUSED
                    times[name].append(median_step_ms(each, prompt, rows, args.new_tokens))
            attention.paged_write_decode = FUSED
            line = f"{mode:16} rows {rows:2}: step {statistics.median(times['fused']):6.2f} ms"
            for name in engines.keys() - {"fused"}:
                ratios = [u / f for u, f in zip(times[name], times["fused"], strict=True)]
                rounds = ", ".join(f"{r:.3f}" for r in ratios)
                line += (f", {name} {statistics.median(times[name]):6.2f} ms, {name}/this "
                         f"{statistics.median(ratios):.3f} (rounds {rounds})")  # fmt: skip
            print(line + (" [compiled]" if args.compile else ""), flush=True)


if __name__ == "__main__":
    main()
