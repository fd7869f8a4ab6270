"""Speculative decoding at batch 1: plain greedy vs prompt lookup, early exit and a draft model.

Input-grounded tasks on a ~500-token passage (repeat it, fix its typos, summarise it), greedy,
128 new tokens, the embedded model in float32. For each proposer: Decoda's tokens/s, its speed-up
over Decoda's plain greedy, the acceptance rate, and HF ``generate()`` with the same assistant
settings (tokens/s and Decoda's ratio to it). Outputs are checked equal to plain greedy.

    .venv/bin/python loadtests/bench_speculative.py [--universal]

``--universal`` adds universal assisted decoding with the real pair of different tokenizers:
SmolLM2-135M-Instruct as target with Gemma 3 270M as assistant, and the reverse (Gemma is a base
model, so its prompts are the plain task texts).
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from decoding.engine.core import Engine
from decoding.engine.limits import EngineLimits
from decoding.model.attention import register_attention
from decoding.model.loading import load_model
from decoding.model.packed_linear import pack_linears
from decoding.params import GenerationParams
from decoding.telemetry import EngineObserver

PASSAGE = (
    "The old lighthouse on the northern cape had not been lit for thirty years when Mara arrived with "
    "a suitcase of tools and a notebook full of drawings. The town council had sold it to her for a "
    "single coin, on the condition that she restore the lamp and keep the building open to visitors on "
    "the first Sunday of every month. She spent the first winter replacing the broken windows, one "
    "pane at a time, because the glass had to be carried up one hundred and twelve steps. In the "
    "spring she rebuilt the clockwork that turned the lens, cleaning each brass gear with vinegar and "
    "salt until it shone. The fishermen laughed at her at first, but by summer they were bringing her "
    "spare parts from the harbour, and the baker left bread on her doorstep every Friday. When the lamp "
    "finally turned again in September, the whole town climbed the hill to watch the beam sweep across "
    "the water. Children counted the seconds between flashes, and the oldest fisherman said it was the "
    "same rhythm he remembered from his boyhood. Mara kept the lighthouse for twenty more years. She "
    "wrote down the weather every evening, repaired the clockwork twice after storms, and taught three "
    "apprentices how to trim the wick and polish the lens. The notebook with her drawings is still "
    "kept in the small museum at the foot of the tower, open on the page where she sketched the gears "
    "for the first time, with a note in the margin: everything that turns can be made to turn again."
)
TASKS = [
    f"Repeat the following passage exactly, word for word.\n\n{PASSAGE}",
    "Rewrite the following passage, correcting the spelling mistakes and changing nothing else.\n\n"
    + PASSAGE.replace("lighthouse", "lighthuose").replace("clockwork", "clockwrok").replace("winter", "wintre"),
    f"Summarize the following passage in a few sentences, reusing its own words.\n\n{PASSAGE}",
]


def chat_ids(tokenizer: object, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
        "input_ids"
    ]


class Acceptance(EngineObserver):
    def __init__(self) -> None:
        self.drafted = 0
        self.accepted = 0

    def on_speculation(self, proposer: str, num_drafted: int, num_accepted: int) -> None:
        self.drafted += num_drafted
        self.accepted += num_accepted


def decoda_run(engine: Engine, prompt_ids: list[int], new_tokens: int, knobs: dict) -> tuple[float, list[int]]:
    tokens: list[int] = []
    engine.emit = lambda out: tokens.extend(t for d in out.deltas for t in d.token_ids)
    params = GenerationParams(max_new_tokens=new_tokens, **knobs)
    with torch.inference_mode():
        start = time.perf_counter()
        engine.add_request(f"bench-{time.perf_counter_ns()}", prompt_ids, params)
        while engine.has_work():
            engine.step()
        return time.perf_counter() - start, tokens


def hf_run(model: torch.nn.Module, prompt_ids: list[int], new_tokens: int, knobs: dict) -> tuple[float, int]:
    ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                             **knobs)  # fmt: skip
        return time.perf_counter() - start, out.shape[1] - len(prompt_ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--early-exit", type=int, default=8)
    parser.add_argument("--universal", action="store_true", help="also the Gemma 3 270M / SmolLM2 pair")
    parser.add_argument("--only-universal", action="store_true", help="only the Gemma 3 270M / SmolLM2 pair")
    parser.add_argument("--no-hf", action="store_true", help="skip HF generate() in the universal rows")
    args = parser.parse_args()
    reference = load_model(args.model, dtype="float32", attn_implementation="sdpa")
    served = load_model(args.model, dtype="float32", attn_implementation=register_attention())
    pack_linears(served.model)
    tokenizer = reference.tokenizer
    limits = EngineLimits(max_model_len=2048, max_num_seqs=4, max_num_batched_tokens=1024)
    engine = Engine(
        served.model, copy.deepcopy(tokenizer), served.eos_token_ids, limits, lambda _: None, torch.device("cpu"),
        assistants={"self": served.model},
    )  # fmt: skip
    prompts = [chat_ids(tokenizer, t) for t in TASKS]
    proposers = {
        "prompt lookup (10 tokens)": ({"prompt_lookup_num_tokens": 10}, {"prompt_lookup_num_tokens": 10}),
        f"early exit (layer {args.early_exit})": (
            {"assistant_early_exit": args.early_exit},
            {"assistant_early_exit": args.early_exit},
        ),
        "draft model (itself)": ({"assistant_model": "self"}, {"assistant_model": reference.model}),
    }
    n = args.new_tokens
    if args.only_universal:
        universal_rows(args, reference, served, n)
        return
    print(f"model {args.model}, prompts {[len(p) for p in prompts]} tokens, {n} new tokens, greedy, batch 1")
    decoda_run(engine, prompts[0], 4, {})  # warm-up
    hf_run(reference.model, prompts[0], 4, {})
    plain = [decoda_run(engine, p, n, {}) for p in prompts]
    hf_plain = [hf_run(reference.model, p, n, {}) for p in prompts]
    plain_rate = sum(len(t) for _, t in plain) / sum(s for s, _ in plain)
    hf_plain_rate = sum(k for _, k in hf_plain) / sum(s for s, _ in hf_plain)
    print(f"{'proposer':28} {'tok/s':>6} {'vs greedy':>9} {'accepted':>9} {'HF tok/s':>9} {'HF vs greedy':>12} "
          f"{'vs HF':>6}")  # fmt: skip
    print(f"{'plain greedy':28} {plain_rate:6.1f} {1:8.2f}x {'-':>9} {hf_plain_rate:9.1f} {1:11.2f}x "
          f"{plain_rate / hf_plain_rate:5.2f}x")  # fmt: skip
    for name, (ours, theirs) in proposers.items():
        observer = Acceptance()
        engine.observer = observer
        runs = [decoda_run(engine, p, n, ours) for p in prompts]
        for (_, tokens), (_, expected) in zip(runs, plain, strict=True):
            assert tokens == expected, f"{name}: output differs from plain greedy"
        rate = sum(len(t) for _, t in runs) / sum(s for s, _ in runs)
        hf = [hf_run(reference.model, p, n, theirs) for p in prompts]
        hf_rate = sum(k for _, k in hf) / sum(s for s, _ in hf)
        accepted = observer.accepted / observer.drafted if observer.drafted else 0.0
        print(f"{name:28} {rate:6.1f} {rate / plain_rate:8.2f}x {accepted:8.0%} {hf_rate:9.1f} "
              f"{hf_rate / hf_plain_rate:11.2f}x {rate / hf_rate:5.2f}x")  # fmt: skip
        engine.observer = EngineObserver()
    if args.universal:
        universal_rows(args, reference, served, n)


def universal_rows(args: argparse.Namespace, smol_ref, smol_served, n: int) -> None:  # noqa: ANN001
    """Target and assistant with different tokenizers, both directions."""
    gemma_ref = load_model("gemma3-270m", dtype="float32", attn_implementation="sdpa")
    gemma_served = load_model("gemma3-270m", dtype="float32", attn_implementation=register_attention())
    pack_linears(gemma_served.model)
    pairs = [
        ("SmolLM2 <- Gemma 3 270M", smol_ref, smol_served, gemma_ref, gemma_served, True),
        ("Gemma 3 270M <- SmolLM2", gemma_ref, gemma_served, smol_ref, smol_served, False),
    ]
    for label, target_ref, target, helper_ref, helper, chat in pairs:
        tokenizer = target.tokenizer
        limits = EngineLimits(max_model_len=2048, max_num_seqs=4, max_num_batched_tokens=1024)
        assistant = (helper.model, copy.deepcopy(helper.tokenizer), set(helper.eos_token_ids))
        engine = Engine(
            target.model, copy.deepcopy(tokenizer), target.eos_token_ids, limits, lambda _: None,
            torch.device("cpu"), assistants={"helper": assistant},
        )  # fmt: skip
        prompts = [chat_ids(tokenizer, t) if chat else tokenizer.encode(t) for t in TASKS]
        decoda_run(engine, prompts[0], 4, {})
        plain = [decoda_run(engine, p, n, {}) for p in prompts]
        observer = Acceptance()
        engine.observer = observer
        runs = [decoda_run(engine, p, n, {"assistant_model": "helper"}) for p in prompts]
        for (_, tokens), (_, expected) in zip(runs, plain, strict=True):
            assert tokens == expected, f"{label}: output differs from plain greedy"
        plain_rate = sum(len(t) for _, t in plain) / sum(s for s, _ in plain)
        rate = sum(len(t) for _, t in runs) / sum(s for s, _ in runs)
        accepted = observer.accepted / observer.drafted if observer.drafted else 0.0
        print(f"universal {label:18} {rate:6.1f} {rate / plain_rate:8.2f}x {accepted:8.0%}  "
              f"(Decoda plain greedy {plain_rate:.1f} tok/s)", flush=True)  # fmt: skip
        hf_knobs = {"assistant_model": helper_ref.model, "tokenizer": target_ref.tokenizer,
                    "assistant_tokenizer": helper_ref.tokenizer}  # fmt: skip
        if args.no_hf:
            continue
        try:
            hf_plain = [hf_run(target_ref.model, p, n, {}) for p in prompts]
            hf = [hf_run(target_ref.model, p, n, hf_knobs) for p in prompts]
        except Exception as exc:  # transformers' own universal decoding may fail on a pair
            print(f"    HF generate() with this pair failed: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        hf_plain_rate = sum(k for _, k in hf_plain) / sum(s for s, _ in hf_plain)
        hf_rate = sum(k for _, k in hf) / sum(s for s, _ in hf)
        print(f"    HF generate(): {hf_rate:.1f} tok/s = {hf_rate / hf_plain_rate:.2f}x its plain greedy "
              f"({hf_plain_rate:.1f}); Decoda {rate / hf_rate:.2f}x HF")  # fmt: skip


if __name__ == "__main__":
    main()
