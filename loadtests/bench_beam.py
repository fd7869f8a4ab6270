"""Beam search speed: Decoda's engine against HF ``model.generate(num_beams=4)``, in one run.

Batch 1: same model, prompt and forced length (min_new_tokens = max_new_tokens), float32,
tokens/s = new tokens of the returned sequence / wall time. Then the engine's throughput with 4
beam requests (different prompts) submitted at once against the same 4 run one after another.

    .venv/bin/python loadtests/bench_beam.py --new-tokens 64
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from decoding.engine.core import Engine
from decoding.engine.limits import EngineLimits
from decoding.model.attention import register_attention
from decoding.model.loading import load_model
from decoding.model.packed_linear import pack_linears
from decoding.params import GenerationParams

PROMPTS = [
    "Write a long story about a dragon who learns to bake bread in a small mountain village.",
    "Explain how a bicycle stays upright while moving.",
    "Describe the water cycle to a ten-year-old.",
    "List some ideas for a rainy weekend at home.",
]


def chat_ids(tokenizer: object, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def hf_seconds(model: torch.nn.Module, prompt_ids: list[int], new_tokens: int, num_beams: int) -> float:
    input_ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        start = time.perf_counter()
        out = model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            num_beams=num_beams,
            do_sample=False,
        )
        elapsed = time.perf_counter() - start
    assert out.shape[1] - len(prompt_ids) == new_tokens
    return elapsed


def decoda_seconds(engine: Engine, batches: list[list[list[int]]], new_tokens: int, num_beams: int) -> float:
    """Runs each batch of prompts to completion, batches one after another; total wall time."""
    with torch.inference_mode():
        start = time.perf_counter()
        for b, batch in enumerate(batches):
            for i, prompt_ids in enumerate(batch):
                params = GenerationParams(max_new_tokens=new_tokens, min_new_tokens=new_tokens, num_beams=num_beams)
                engine.add_request(f"bench-{b}-{i}", prompt_ids, params)
            while engine.has_work():
                engine.step()
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--num-beams", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    reference = load_model(args.model, dtype="float32", attn_implementation="sdpa")
    tokenizer = reference.tokenizer
    prompts = [chat_ids(tokenizer, p) for p in PROMPTS]
    served = load_model(args.model, dtype="float32", attn_implementation=register_attention()).model
    pack_linears(served)
    limits = EngineLimits(max_model_len=1024, max_num_seqs=4 * args.num_beams, max_num_batched_tokens=512)
    eos = reference.eos_token_ids
    engine = Engine(served, copy.deepcopy(tokenizer), eos, limits, lambda _: None, torch.device("cpu"))
    n, beams = args.new_tokens, args.num_beams
    print(f"model {args.model}, num_beams {beams}, {n} forced new tokens, median of {args.runs} runs after a warm-up")

    hf_seconds(reference.model, prompts[0], 4, beams)  # warm-up
    decoda_seconds(engine, [[prompts[0]]], 4, beams)
    hf = statistics.median(hf_seconds(reference.model, prompts[0], n, beams) for _ in range(args.runs))
    ours = statistics.median(decoda_seconds(engine, [[prompts[0]]], n, beams) for _ in range(args.runs))
    print(f"batch 1     HF generate {n / hf:6.1f} tok/s   Decoda {n / ours:6.1f} tok/s   ratio {hf / ours:.2f}x")

    sequential = decoda_seconds(engine, [[p] for p in prompts], n, beams)
    together = decoda_seconds(engine, [prompts], n, beams)
    total = n * len(prompts)
    print(
        f"4 requests  sequential {total / sequential:6.1f} tok/s   concurrent {total / together:6.1f} tok/s   "
        f"speed-up {sequential / together:.2f}x"
    )


if __name__ == "__main__":
    main()
