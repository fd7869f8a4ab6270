"""Quantized weights vs float: resident memory, per-step profile, decode speed and quality per mode.

Each mode runs in its own process (a fresh resident size), loading the embedded SmolLM2 as the
server does (``load_model`` + ``prepare_forward``), then:

* memory: resident set after loading and after the measured decode steps;
* profile: engine steps with 1 and 16 greedy rows decoding (prompts of 16 tokens, KV ~40-80
  positions), split by module hooks into linears (every linear and the LM head), attention (the
  attention modules minus their projections), other forward (embedding, norms, MLP activation)
  and outside the forward (sampling, scheduling, streaming);
* quality: greedy continuations of 8 prompts compared with float32 (identical, and the mean
  number of tokens before the first difference out of 32), and the mean KL divergence from
  float32 plus perplexity, teacher-forced over a fixed text.

    .venv/bin/python loadtests/bench_quantization.py                 # every mode
    .venv/bin/python loadtests/bench_quantization.py --modes gguf,int8 --threads 2
    .venv/bin/python loadtests/bench_quantization.py --modes gguf,gguf+compile --no-quality

``+compile`` modes run the forward compiled (``--compile``); module hooks would break its
graphs, so they report the whole step and the forward only, and no quality (same weights).

The machine is shared and drifts 15-30% over minutes: compare the modes of one run, as ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = {  # name: (dtype, quantization, --compile)
    "float32": ("float32", "none", False),
    "bfloat16": ("bfloat16", "none", False),
    "gguf": ("float32", "gguf", False),
    "int8": ("float32", "int8", False),
    "int4": ("float32", "int4", False),
    "float32+compile": ("float32", "none", True),
    "gguf+compile": ("float32", "gguf", True),
    "gguf+bfloat16": ("bfloat16", "gguf", False),
    "gguf+bfloat16+compile": ("bfloat16", "gguf", True),
}
DEFAULT_MODES = "float32,bfloat16,gguf,int8,int4"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "To make a cup of tea, first",
    "Water boils at a temperature of",
    "The largest planet in the solar system is",
    "In 1969, astronauts",
]
TEXT = (
    "The Industrial Revolution began in Great Britain in the late eighteenth century and spread to "
    "Western Europe and North America over the following decades. It marked a shift from hand "
    "production methods to machines, new chemical manufacturing and iron production processes, the "
    "increasing use of steam power and water power, and the development of machine tools. Textiles "
    "were the dominant industry in terms of employment, value of output and capital invested, and the "
    "textile industry was also the first to use modern production methods. Economic historians agree "
    "that the onset of the Industrial Revolution is the most important event in human history since "
    "the domestication of animals and plants."
)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_mode(name: str, threads: int, out_dir: Path, quality: bool = True) -> dict:
    """Everything for one mode, inside this (fresh) process."""
    import torch

    from decoding.engine.launch import prepare_forward
    from decoding.model.attention import register_attention
    from decoding.model.loading import load_model

    torch.set_num_threads(threads)
    dtype, quantization, compiled = MODES[name]
    start = time.perf_counter()
    loaded = load_model("smollm2-135m-instruct", dtype=dtype, quantization=quantization, attn_implementation="sdpa")
    prepare_forward(loaded.model, compile=compiled)
    result: dict = {"mode": name, "load_s": time.perf_counter() - start, "rss_loaded_mb": rss_mb()}
    loaded.model.set_attn_implementation(register_attention())  # the engine's attention for the steps
    result["profile"] = {rows: profile_steps(loaded, rows, hooks=not compiled) for rows in (1, 16)}
    loaded.model.set_attn_implementation("sdpa")  # transformers' own for generate() and the text
    result["rss_after_mb"] = rss_mb()
    if quality and not compiled:
        result["greedy"] = greedy_continuations(loaded)
        result["logprobs_file"] = str(text_logprobs(loaded, out_dir / f"{name}.pt"))
    return result


def profile_steps(loaded, rows: int, steps: int = 24, hooks: bool = True) -> dict:  # noqa: ANN001
    """Mean ms per decode step, split by module hooks, through the engine as the server runs it."""
    import torch

    from decoding.engine.core import Engine
    from decoding.engine.limits import EngineLimits
    from decoding.params import GenerationParams

    model = loaded.model
    spent = {"linears": 0.0, "attention": 0.0, "forward": 0.0}
    inside_attention = {"linears": 0.0}
    depth = {"attention": 0}
    handles = []

    def timed(module, key: str) -> None:  # noqa: ANN001
        def pre(*_: object) -> None:
            module._bench_start = time.perf_counter()
            if key == "attention":
                depth["attention"] += 1

        def post(*_: object) -> None:
            elapsed = time.perf_counter() - module._bench_start
            spent[key] += elapsed
            if key == "attention":
                depth["attention"] -= 1
            elif key == "linears" and depth["attention"]:
                inside_attention["linears"] += elapsed

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))

    for module in model.modules() if hooks else ():
        kind = type(module).__name__
        if kind in ("Linear", "PackedLinear", "QuantizedLinear"):
            timed(module, "linears")
        elif kind.endswith("Attention"):
            timed(module, "attention")
    timed(model, "forward")
    limits = EngineLimits(max_model_len=512, max_num_seqs=16, max_num_batched_tokens=512)
    engine = Engine(model, loaded.tokenizer, [], limits, lambda _: None, torch.device("cpu"))
    prompt = loaded.tokenizer(TEXT).input_ids[:16]
    for i in range(rows):
        engine.add_request(
            f"r{i}", prompt[i % 4 :] + [100 + i], GenerationParams(max_new_tokens=steps + 40, ignore_eos=True)
        )
    with torch.inference_mode():
        for _ in range(8):  # prefill and warm-up
            engine.step()
        for key in spent:
            spent[key] = 0.0
        inside_attention["linears"] = 0.0
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        total = time.perf_counter() - start
    for handle in handles:
        handle.remove()
    per_step = {k: v / steps * 1000 for k, v in spent.items()}
    attention = per_step["attention"] - inside_attention["linears"] / steps * 1000
    if not hooks:  # only the whole forward was timed
        return {"step_ms": total / steps * 1000, "forward_ms": per_step["forward"],
                "outside_forward_ms": total / steps * 1000 - per_step["forward"], "tok_s": rows * steps / total}
    return {
        "step_ms": total / steps * 1000,
        "linears_ms": per_step["linears"],
        "attention_ms": attention,
        "other_forward_ms": per_step["forward"] - per_step["linears"] - attention,
        "outside_forward_ms": total / steps * 1000 - per_step["forward"],
        "tok_s": rows * steps / total,
    }


def greedy_continuations(loaded, new_tokens: int = 32) -> list[list[int]]:  # noqa: ANN001
    import torch

    out = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = loaded.tokenizer(prompt, return_tensors="pt").input_ids
            generated = loaded.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                min_new_tokens=new_tokens,
            )  # fmt: skip
            out.append(generated[0, ids.shape[1] :].tolist())
    return out


def text_logprobs(loaded, path: Path) -> Path:  # noqa: ANN001
    import torch

    ids = loaded.tokenizer(TEXT, return_tensors="pt").input_ids
    with torch.inference_mode():
        logits = loaded.model(ids, attention_mask=torch.ones_like(ids)).logits[0].float()
    torch.save({"logprobs": logits.log_softmax(-1), "ids": ids[0]}, path)
    return path


def compare(results: list[dict]) -> None:
    import torch

    reference = next(r for r in results if r["mode"] == "float32")
    print(
        "\n| mode | resident after load | after decoding | load s | step ms, 1 row | tok/s, 1 row | "
        "step ms, 16 rows | tok/s, 16 rows |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        p1, p16 = (
            r["profile"][1] if 1 in r["profile"] else r["profile"]["1"],
            r["profile"].get(16) or r["profile"]["16"],
        )
        print(
            f"| {r['mode']} | {r['rss_loaded_mb']:.0f} MB | {r['rss_after_mb']:.0f} MB | {r['load_s']:.1f} | "
            f"{p1['step_ms']:.1f} | {p1['tok_s']:.1f} | {p16['step_ms']:.1f} | {p16['tok_s']:.1f} |"
        )
    print("\nper-step profile, ms (linears / attention / other forward / outside the forward)")
    print("\n| mode | 1 row | 16 rows |")
    print("|---|---|---|")
    for r in results:
        cells = []
        for rows in ("1", "16"):
            p = r["profile"].get(rows) or r["profile"][int(rows)]
            if "linears_ms" not in p:
                cells.append(f"compiled forward {p['forward_ms']:.1f} / {p['outside_forward_ms']:.1f}")
                continue
            cells.append(
                f"{p['linears_ms']:.1f} / {p['attention_ms']:.1f} / {p['other_forward_ms']:.1f} / "
                f"{p['outside_forward_ms']:.1f}"
            )
        print(f"| {r['mode']} | {cells[0]} | {cells[1]} |")
    if "greedy" not in reference:
        return
    ref = torch.load(reference["logprobs_file"])
    print("\nquality against float32 (greedy: 8 prompts x 32 tokens; KL and perplexity teacher-forced on a fixed text)")
    print(
        "\n| mode | identical continuations | tokens before first difference (mean of 32) | "
        "mean KL to float32 | perplexity |"
    )
    print("|---|---:|---:|---:|---:|")
    for r in (r for r in results if "logprobs_file" in r):
        data = torch.load(r["logprobs_file"])
        logprobs, ids = data["logprobs"], data["ids"]
        kl = float((ref["logprobs"].exp() * (ref["logprobs"] - logprobs)).sum(-1).mean())
        nll = -logprobs[:-1].gather(1, ids[1:, None]).mean()
        same = sum(a == b for a, b in zip(r["greedy"], reference["greedy"], strict=True))
        prefix = [next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
                  for a, b in zip(r["greedy"], reference["greedy"], strict=True)]  # fmt: skip
        print(
            f"| {r['mode']} | {same}/{len(PROMPTS)} | {sum(prefix) / len(prefix):.1f} | {kl:.4f} | "
            f"{float(torch.exp(nll)):.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default=DEFAULT_MODES, help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-quality", action="store_true", help="memory and speed only")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one mode, print JSON
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(run_mode(args.one, args.threads, Path(args.out), not args.no_quality)))
        return
    modes = ["float32"] + [m for m in args.modes.split(",") if m != "float32"]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            command = [sys.executable, __file__, "--one", mode, "--threads", str(args.threads), "--out", tmp]
            command += ["--no-quality"] if args.no_quality else []
            done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ), check=False)
            line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                print(f"{mode} failed:\n{done.stderr[-3000:]}")
                continue
            results.append(json.loads(line[len("RESULT ") :]))
            print(f"{mode}: done", flush=True)
        compare(results)


if __name__ == "__main__":
    main()
