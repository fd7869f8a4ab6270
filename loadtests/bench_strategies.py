"""Batch-1 cost of contrastive search and DoLa against greedy on the same model and prompt.

Each strategy generates the same number of forced tokens (min_new_tokens = max_new_tokens) through
Decoda's engine; the table prints tokens/s and the cost of one step relative to a greedy step.
Goal for contrastive search at top_k 4: a step costs at most 1.5x a greedy step (HF 4.x copies the
whole KV cache top_k times per step; Decoda feeds the candidates as one row of sibling tokens).

    .venv/bin/python loadtests/bench_strategies.py --new-tokens 64 [--hf4-venv /tmp/decoda-hf4-venv]

With ``--hf4-venv`` (the transformers 4.x venv ``tests/make_hf4_golden.py`` builds), the same
contrastive and DoLa runs go through transformers 4.x's ``generate()`` for comparison.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch

from decoding.engine.core import Engine
from decoding.engine.limits import EngineLimits
from decoding.model.attention import register_attention
from decoding.model.loading import load_model
from decoding.model.packed_linear import pack_linears
from decoding.params import GenerationParams

PROMPT = "Write a long story about a dragon who learns to bake bread in a small mountain village."
STRATEGIES = {
    "greedy": {},
    "contrastive top_k=4": {"penalty_alpha": 0.6, "top_k": 4},
    "contrastive top_k=8": {"penalty_alpha": 0.6, "top_k": 8},
    "dola high": {"dola_layers": "high", "repetition_penalty": 1.2},
    "dola low": {"dola_layers": "low", "repetition_penalty": 1.2},
    "beam num_beams=4": {"num_beams": 4},
}


def seconds(engine: Engine, prompt_ids: list[int], new_tokens: int, knobs: dict) -> float:
    params = GenerationParams(max_new_tokens=new_tokens, min_new_tokens=new_tokens, **knobs)
    with torch.inference_mode():
        start = time.perf_counter()
        engine.add_request(f"bench-{time.perf_counter_ns()}", prompt_ids, params)
        while engine.has_work():
            engine.step()
        return time.perf_counter() - start


HF4_SCRIPT = """
import json, statistics, sys, time, torch
sys.path.insert(0, sys.argv[1])
from make_hf4_golden import load_hf4
job = json.loads(sys.argv[2])
model = load_hf4(job["folder"], job["rope_theta"])
ids = torch.tensor([job["prompt_ids"]])
out = {}
for name, knobs in job["strategies"].items():
    def run(n):
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=job["pad"], **knobs)
        return time.perf_counter() - start
    run(4)
    out[name] = job["new_tokens"] / statistics.median(run(job["new_tokens"]) for _ in range(job["runs"]))
print(json.dumps(out))
"""


def hf4_tokens_per_s(venv: str, folder: str, prompt_ids: list[int], new_tokens: int, runs: int) -> dict[str, float]:
    config = json.loads((Path(folder) / "config.json").read_text())
    job = {
        "folder": folder,
        "rope_theta": config.get("rope_theta") or config["rope_parameters"]["rope_theta"],
        "pad": config.get("pad_token_id"),
        "prompt_ids": prompt_ids,
        "new_tokens": new_tokens,
        "runs": runs,
        "strategies": {k: v for k, v in STRATEGIES.items() if "beam" not in k},
    }
    tests_dir = str(Path(__file__).resolve().parent.parent / "tests")
    python = str(Path(venv) / "bin" / "python")
    result = subprocess.run([python, "-c", HF4_SCRIPT, tests_dir, json.dumps(job)], capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(result.stderr[-2000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hf4-venv", default=None, help="also time transformers 4.x generate() from this venv")
    args = parser.parse_args()
    loaded = load_model(args.model, dtype="float32", attn_implementation=register_attention())
    pack_linears(loaded.model)
    limits = EngineLimits(max_model_len=1024, max_num_seqs=8, max_num_batched_tokens=512)
    tokenizer = copy.deepcopy(loaded.tokenizer)
    engine = Engine(loaded.model, tokenizer, loaded.eos_token_ids, limits, lambda _: None, torch.device("cpu"))
    prompt_ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    n = args.new_tokens
    print(f"model {args.model}, prompt {len(prompt_ids)} tokens, {n} forced new tokens, batch 1, "
          f"median of {args.runs} runs after a warm-up")  # fmt: skip
    hf4: dict[str, float] = {}
    if args.hf4_venv:
        hf4 = hf4_tokens_per_s(args.hf4_venv, loaded.model.name_or_path, list(prompt_ids), n, args.runs)
    print(f"{'strategy':22} {'tok/s':>7} {'step vs greedy':>15} {'HF 4.x tok/s':>13} {'vs HF 4.x':>10}")
    greedy = None
    for name, knobs in STRATEGIES.items():
        seconds(engine, prompt_ids, 4, knobs)  # warm-up
        elapsed = statistics.median(seconds(engine, prompt_ids, n, knobs) for _ in range(args.runs))
        greedy = greedy or elapsed
        theirs = hf4.get(name)
        versus = f"{theirs:13.1f} {n / elapsed / theirs:9.2f}x" if theirs else f"{'-':>13} {'-':>10}"
        print(f"{name:22} {n / elapsed:7.1f} {elapsed / greedy:14.2f}x {versus}")


if __name__ == "__main__":
    main()
