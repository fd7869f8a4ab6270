"""Batch-1 decode speed: Decoda's engine loop against HF ``model.generate()``, in one run.

Same model, same prompt, 128 forced new tokens (min_new_tokens = max_new_tokens = 128), greedy and
seeded sampling. HF always runs in float32 with its default SDPA attention; Decoda runs in each
configuration given with ``--configs`` (``fp32``, ``bf16``, ``fp32+compile``, ``bf16+compile``).

    .venv/bin/python loadtests/bench_decode.py --configs fp32,fp32+compile
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from decoding.engine.core import Engine
from decoding.engine.launch import prepare_forward
from decoding.engine.limits import EngineLimits
from decoding.engine.warmup import warm_up
from decoding.model.attention import register_attention
from decoding.model.loading import load_model
from decoding.params import GenerationParams

PROMPT = "Write a long story about a dragon who learns to bake bread in a small mountain village."
SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 50, "top_p": 0.95}


def hf_tokens_per_s(
    model: torch.nn.Module, prompt_ids: list[int], new_tokens: int, runs: int, **knobs: object
) -> float:
    input_ids = torch.tensor([prompt_ids])
    times = []
    with torch.inference_mode():
        for i in range(runs + 1):
            torch.manual_seed(0)
            start = time.perf_counter()
            out = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                **({"do_sample": False} | knobs),
            )
            if i:  # the first run warms up
                times.append(time.perf_counter() - start)
            assert out.shape[1] - len(prompt_ids) == new_tokens
    return new_tokens / statistics.median(times)


def decoda_tokens_per_s(engine: Engine, prompt_ids: list[int], new_tokens: int, runs: int, **knobs: object) -> float:
    times = []
    done: list[bool] = []
    engine.emit = lambda output: done.append(output.finished) if output.finished else None
    with torch.inference_mode():
        for i in range(runs + 1):
            params = GenerationParams(max_new_tokens=new_tokens, min_new_tokens=new_tokens, seed=0, **knobs)
            start = time.perf_counter()
            engine.add_request(f"bench-{i}", prompt_ids, params)
            while engine.has_work():
                engine.step()
            if i:
                times.append(time.perf_counter() - start)
    return new_tokens / statistics.median(times)


def build_engine(
    model_name: str,
    config_name: str,
    tokenizer: object,
    eos: list[int],
    *,
    quantization: str = "none",
    max_num_seqs: int = 1,
) -> Engine:
    dtype = "bfloat16" if config_name.startswith("bf16") else "float32"
    loaded = load_model(model_name, dtype=dtype, quantization=quantization, attn_implementation=register_attention())
    model = loaded.model
    prepare_forward(model, compile="compile" in config_name)
    limits = EngineLimits(max_model_len=1024, max_num_seqs=max_num_seqs, max_num_batched_tokens=512)
    engine = Engine(model, copy.deepcopy(tokenizer), eos, limits, lambda _: None, torch.device("cpu"))
    if "compile" in config_name:  # as the server does before it serves
        warm_up(engine, tokenizer("Warm up the compiled layers.").input_ids)
    return engine


def chat_prompt_ids(tokenizer: object) -> list[int]:
    """PROMPT as the user's one chat message, through the model's template."""
    messages = [{"role": "user", "content": PROMPT}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--configs", default="fp32", help="comma list of fp32, bf16, fp32+compile, bf16+compile")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    reference = load_model(args.model, dtype="float32", attn_implementation="sdpa")
    tokenizer = reference.tokenizer
    prompt_ids = chat_prompt_ids(tokenizer)
    print(
        f"model {args.model}, prompt {len(prompt_ids)} tokens, {args.new_tokens} forced new tokens, "
        f"median of {args.runs} runs, torch threads {torch.get_num_threads()}"
    )
    hf = {
        "greedy": hf_tokens_per_s(reference.model, prompt_ids, args.new_tokens, args.runs),
        "sample": hf_tokens_per_s(reference.model, prompt_ids, args.new_tokens, args.runs, **SAMPLING),
    }
    print(f"{'mode':8} {'config':14} {'HF fp32 tok/s':>14} {'Decoda tok/s':>13} {'ratio':>6}")
    for config_name in args.configs.split(","):
        engine = build_engine(args.model, config_name, tokenizer, reference.eos_token_ids)
        for mode, knobs in (("greedy", {}), ("sample", SAMPLING)):
            ours = decoda_tokens_per_s(engine, prompt_ids, args.new_tokens, args.runs, **knobs)
            print(f"{mode:8} {config_name:14} {hf[mode]:14.1f} {ours:13.1f} {ours / hf[mode]:5.2f}x")


if __name__ == "__main__":
    main()
