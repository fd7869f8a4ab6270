"""What one hostile-but-valid request costs everyone else: a 16-client load's tok/s alone and with
such a request running beside it, in a loop.

The hostile request sets every list-valued knob at its limit (``decoding/params/sizes.py``):
1024 banned phrases of 32 tokens, 1024 biased sequences, 300 logit biases, half the vocabulary in
``suppress_tokens``, 16 stop sequences and 16 HF stop strings of 512 characters, with ``n`` rows.
Before the limits and the prefix tries a 3 MB ``bad_words_ids`` made every step seconds long;
the goal is ≥ 0.8× (the hostile rows also take their fair share of each batched step, which
costs the others something legitimately).

``--kind grammar`` sends an ambiguous grammar instead (``s: s s | "a"``: it compiles in a millisecond,
then each row's mask grows with every token, ~440 ms at token 900), with ``n`` 16 rows forced to 900
tokens, once per load (the issue's "one ambiguous-grammar request beside them"; sent again and again,
its 16 rows would take their share of every step, which ``--max-concurrency-per-key`` is the limit
for). Its masks' time budget (``decoding/sampling/grammar.py``) fails it with a 400 naming the
constraint before it can slow the others for long. Goal: ≥ 0.8× as well.

One Decoda server (the embedded SmolLM2, float32); the two modes take turns within each round
(order reversed every other round), so drift over minutes hits both.

    .venv/bin/python -m loadtests.bench_hostile --rounds 2
    .venv/bin/python -m loadtests.bench_hostile --kind grammar --hostile-n 16 --hostile-tokens 900 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import threading
import time

import httpx

from loadtests.compare import cpu_summary, local_decoda
from loadtests.loadgen import build_parser as loadgen_parser
from loadtests.loadgen import run_load

VOCAB = 49152  # SmolLM2's


def hostile_body(n: int, max_tokens: int, seed: int = 0) -> dict:
    rng = random.Random(seed)

    def ids(k: int) -> list[int]:
        return [rng.randrange(1000, VOCAB) for _ in range(k)]

    return {
        "prompt": "Write a long story about a lighthouse keeper.",
        "max_tokens": max_tokens,
        "n": n,
        "temperature": 0.8,
        "seed": seed,
        "ignore_eos": True,
        "bad_words_ids": [ids(32) for _ in range(1024)],
        "sequence_bias": [[ids(32), 0.5] for _ in range(1024)],
        "logit_bias": {str(t): 0.1 for t in ids(300)},
        "suppress_tokens": list(range(VOCAB // 2, VOCAB)),
        "stop": ["".join(rng.choice("qxzj") for _ in range(512)) for _ in range(16)],
        "stop_strings": ["".join(rng.choice("qxzj") for _ in range(512)) for _ in range(16)],
    }


def grammar_body(n: int, max_tokens: int) -> dict:
    return {
        "prompt": "a",
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "n": n,
        "temperature": 0.8,
        "seed": 0,
        "structured_outputs": {"grammar": 'start: s\ns: s s | "a"\n'},
    }


def keep_sending(url: str, body: dict, stop: threading.Event, errors: list[str], refusals: list[str]) -> None:
    """Send the hostile request again and again until ``stop`` (once, for a grammar); its own tokens
    are not counted. A 400 naming the constraint is the server defending itself (counted in
    ``refusals``, with how long the request lived); anything else but a 200 is an error."""
    once = "structured_outputs" in body
    with httpx.Client(timeout=600) as http:
        while not stop.is_set():
            started = time.monotonic()
            r = http.post(f"{url}/v1/completions", json=body)
            if r.status_code == 400 and "structured_outputs" in r.text:
                refusals.append(f"after {time.monotonic() - started:.1f} s: {r.json()['error']['message']}")
            elif r.status_code != 200:
                errors.append(f"{r.status_code} {r.text[:200]}")
                return
            if once:
                return


def _load(url: str, mode: str, body: dict, args: argparse.Namespace) -> float:
    """The clients' output tok/s, alone or with the hostile request sent again and again beside them."""
    stop, errors, refusals = threading.Event(), [], []
    sender = None
    if mode != "alone":
        sender = threading.Thread(target=keep_sending, args=(url, body, stop, errors, refusals), daemon=True)
        sender.start()
    load = loadgen_parser().parse_args(
        ["--url", url, "--concurrency", str(args.concurrency), "--max-tokens", str(args.max_tokens),
         "--requests", str(args.concurrency * args.requests_per_client), "--ignore-eos"]
    )  # fmt: skip
    summary = asyncio.run(run_load(load))
    stop.set()
    if sender is not None:
        sender.join(600)
    if summary["errors"] or errors:
        raise SystemExit(f"{mode}: {summary.get('first_error') or errors[0]}")
    if refusals:
        print(f"  the hostile request was refused {len(refusals)} times: {refusals[0][:160]}", flush=True)
    return summary["output_tok_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests-per-client", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--hostile-n", type=int, default=4, help="rows of the hostile request")
    parser.add_argument("--kind", choices=("lists", "grammar"), default="lists", help="what makes it hostile")
    parser.add_argument("--hostile-tokens", type=int, default=None, help="its length (default: --max-tokens)")
    args = parser.parse_args()
    length = args.hostile_tokens or args.max_tokens
    body = hostile_body(args.hostile_n, length) if args.kind == "lists" else grammar_body(args.hostile_n, length)
    print(f"CPU: {cpu_summary()}\nhostile body: {len(json.dumps(body)) / 1e6:.2f} MB, n={args.hostile_n}", flush=True)
    results: dict[str, list[float]] = {"alone": [], "beside hostile": []}
    context = str(max(1024, 2 * length))
    with local_decoda(["--max-num-seqs", str(args.concurrency + args.hostile_n), "--max-model-len", context]) as (
        url, _
    ):
        for round_ in range(args.rounds):
            order = list(results) if round_ % 2 == 0 else list(results)[::-1]
            for mode in order:
                results[mode].append(_load(url, mode, body, args))
                print(f"round {round_ + 1} {mode}: {results[mode][-1]:.1f} tok/s", flush=True)
    ratios = [h / a for h, a in zip(results["beside hostile"], results["alone"], strict=True)]
    print(f"\n| clients | alone tok/s | beside a hostile request tok/s | ratio (per round) |\n|---:|---:|---:|---:|\n"
          f"| {args.concurrency} | {statistics.median(results['alone']):.1f} | "
          f"{statistics.median(results['beside hostile']):.1f} | {statistics.median(ratios):.2f}x "
          f"({', '.join(f'{r:.2f}' for r in ratios)}) |")  # fmt: skip


if __name__ == "__main__":
    main()
