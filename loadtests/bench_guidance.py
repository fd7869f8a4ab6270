"""Batch-1 cost of classifier-free guidance against greedy, through Decoda's engine and HF generate().

Guidance feeds each row's unconditional twin in the same forward, so a step carries two rows
instead of one; HF runs the unconditional branch as a second model call inside its logits processor.
Every run generates the same number of forced tokens (min_new_tokens = max_new_tokens).

    .venv/bin/python loadtests/bench_guidance.py --new-tokens 64 --runs 2
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

PROMPT = "Write a long story about a dragon who learns to bake bread in a small mountain village."
NEGATIVE = "A boring, short and sad text."
RUNS = {
    "greedy": {},
    "guidance 1.5 (last prompt token)": {"guidance_scale": 1.5},
    "guidance 3 + negative prompt": {"guidance_scale": 3.0, "negative": True},
}


def ours(engine: Engine, prompt_ids: list[int], new_tokens: int, knobs: dict) -> float:
    params = GenerationParams(max_new_tokens=new_tokens, min_new_tokens=new_tokens, **knobs)
    with torch.inference_mode():
        start = time.perf_counter()
        engine.add_request(f"bench-{time.perf_counter_ns()}", prompt_ids, params)
        while engine.has_work():
            engine.step()
        return time.perf_counter() - start


def hf(model: torch.nn.Module, prompt_ids: list[int], new_tokens: int, knobs: dict) -> float:
    kwargs = dict(knobs)
    if "negative_prompt_ids" in kwargs:
        kwargs["negative_prompt_ids"] = torch.tensor([kwargs["negative_prompt_ids"]])
    with torch.inference_mode():
        start = time.perf_counter()
        model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                       max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, **kwargs)  # fmt: skip
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, dtype="float32", attn_implementation="sdpa")
    reference, tokenizer = loaded.model, loaded.tokenizer
    served = copy.deepcopy(reference)
    served.set_attn_implementation(register_attention())
    pack_linears(served)
    limits = EngineLimits(1024, 4, 512)
    engine = Engine(served, tokenizer, loaded.eos_token_ids, limits, lambda out: None, torch.device("cpu"))
    prompt_ids = tokenizer.encode(PROMPT)
    negative_ids = tokenizer.encode(NEGATIVE)
    print(f"{'run':<34} {'Decoda tok/s':>12} {'vs greedy':>10} {'HF 5 tok/s':>10}")
    ours(engine, prompt_ids, args.new_tokens, {})  # a fresh engine's first forwards carry one-time setup
    hf(reference, prompt_ids, 8, {})
    base = None
    for name, knobs in RUNS.items():
        knobs = dict(knobs)
        if knobs.pop("negative", False):
            knobs["negative_prompt_ids"] = negative_ids
        ours(engine, prompt_ids, 4, knobs)  # warm-up
        ours_s = statistics.median(ours(engine, prompt_ids, args.new_tokens, knobs) for _ in range(args.runs))
        hf_s = statistics.median(hf(reference, prompt_ids, args.new_tokens, knobs) for _ in range(args.runs))
        base = base or ours_s
        print(f"{name:<34} {args.new_tokens / ours_s:>12.1f} {ours_s / base:>9.2f}x {args.new_tokens / hf_s:>10.1f}")


if __name__ == "__main__":
    main()
