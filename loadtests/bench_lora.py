"""LoRA adapters against the base model through the engine: 16 clients over 4 adapters, and one client.

Four seeded rank-``--rank`` PEFT adapters on every projection of the served model are written to a
temporary folder and loaded as the server loads them. The same 16 requests (forced to
``--new-tokens`` tokens: ``min_new_tokens = max_new_tokens``, greedy) run together:

* ``base``: on the base model of an engine serving no adapters (its linears unwrapped);
* ``base, LoRA on``: on the base model of the engine serving the adapters (the wrapping's cost);
* ``4 adapters``: spread over the 4 adapters, 4 requests each, in one batch.

Then one request alone, with and without an adapter. Runs alternate (base, adapters, base, ...) and
the best of ``--runs`` is kept, so a neighbour's load hits both sides alike. Goals (issue 42): 16
clients over 4 adapters >= 0.8x the base's tok/s, one client with an adapter >= 0.9x without.

    .venv/bin/python -m loadtests.bench_lora --new-tokens 32 --runs 2 [--quantization gguf]
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path

import torch

from decoding.engine.core import Engine
from decoding.engine.launch import prepare_forward
from decoding.engine.limits import EngineLimits
from decoding.engine.lora import LoraLimits
from decoding.model.attention import register_attention
from decoding.model.loading import load_model
from decoding.params import GenerationParams

PROMPTS = [f"Write a short note number {i} about the sea, the wind and a small boat." for i in range(16)]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_adapters(model: torch.nn.Module, folder: Path, rank: int) -> list[Path]:
    from peft import LoraConfig, get_peft_model

    paths = []
    for seed in range(4):
        torch.manual_seed(seed)
        peft_model = get_peft_model(
            copy.deepcopy(model), LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS)
        )
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.02)
        peft_model.save_pretrained(str(folder / f"a{seed}"))
        paths.append(folder / f"a{seed}")
        del peft_model
    return paths


def engine_for(args: argparse.Namespace, adapters: list[Path] | None) -> tuple[Engine, object]:
    loaded = load_model(args.model, attn_implementation=register_attention(), quantization=args.quantization)
    prepare_forward(loaded.model, compile=False)
    limits = EngineLimits(max_model_len=1024, max_num_seqs=32, max_num_batched_tokens=512)
    lora = LoraLimits(4, args.rank) if adapters is not None else None
    engine = Engine(loaded.model, loaded.tokenizer, loaded.eos_token_ids, limits, lambda _: None,
                    torch.device("cpu"), lora=lora)  # fmt: skip
    for i, path in enumerate(adapters or []):
        engine.loras.load(f"a{i}", str(path))
    if engine.loras is not None and args.product != "auto":
        engine.loras.bank.use_product(args.product)
    return engine, loaded.tokenizer


def tokens_per_second(engine: Engine, prompts: list[list[int]], adapters: list[str | None], new_tokens: int) -> float:
    params = GenerationParams(max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    with torch.inference_mode():
        started = time.perf_counter()
        for i, (ids, name) in enumerate(zip(prompts, adapters, strict=True)):
            engine.add_request(f"b{time.perf_counter_ns()}-{i}", ids, params.replace(lora_name=name))
        while engine.has_work():
            engine.step()
        return len(prompts) * new_tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument(
        "--product",
        choices=("auto", "native", "mm", "onednn"),
        default="auto",
        help="the LoRA product on a CPU: auto (what the server runs: native where it runs), the native kernel, "
        "torch.mm, or oneDNN",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        float_model = load_model(args.model).model
        paths = write_adapters(float_model, Path(tmp), args.rank)
        del float_model
        plain, tokenizer = engine_for(args, None)
        served, _ = engine_for(args, paths)
        prompts = [tokenizer(p).input_ids for p in PROMPTS]
        spread = [f"a{i % 4}" for i in range(16)]
        runs = {
            "16 clients, base": (plain, prompts, [None] * 16),
            "16 clients, base, LoRA on": (served, prompts, [None] * 16),
            "16 clients, 4 adapters": (served, prompts, spread),
            "1 client, base": (plain, prompts[:1], [None]),
            "1 client, base, LoRA on": (served, prompts[:1], [None]),
            "1 client, adapter": (served, prompts[:1], ["a0"]),
        }
        best = dict.fromkeys(runs, 0.0)
        for _ in range(args.runs):
            for name, (engine, ids, names) in runs.items():
                best[name] = max(best[name], tokens_per_second(engine, ids, names, args.new_tokens))
    print(f"{args.model} quantization={args.quantization} rank={args.rank} product={args.product} "
          f"new_tokens={args.new_tokens} "
          f"threads={torch.get_num_threads()}: best tok/s of {args.runs} runs")  # fmt: skip
    for name, value in best.items():
        print(f"  {name:<28} {value:8.1f}")
    print(f"  16 clients, 4 adapters / base: {best['16 clients, 4 adapters'] / best['16 clients, base']:.2f}x "
          f"(goal >= 0.8)")  # fmt: skip
    print(f"  1 client, adapter / base:      {best['1 client, adapter'] / best['1 client, base']:.2f}x (goal >= 0.9)")


if __name__ == "__main__":
    main()
