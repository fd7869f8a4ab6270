"""Soak: minutes of mixed strategies at 32 clients with hostile requests mixed in.

Prints, every ``--interval`` seconds, the window's tok/s, the server's resident memory, running and
waiting requests; at the end, resident memory over the run's thirds (it must level off once the
``--kv-cache-memory`` pool has been touched: its pages become resident on first use), the KV blocks
held once the server is idle (must be 0) and the answers by kind and status: the clients' must all
be 200, the hostile ones their expected 400s (an over-limit list, a detect text longer than the
context can spell) or 200s (every list at its limit; a client that hangs up mid-stream).

    .venv/bin/python -m loadtests.soak --minutes 15 --clients 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import time
from collections import Counter
from pathlib import Path

import httpx

from loadtests.bench_hostile import hostile_body
from loadtests.compare import cpu_summary, local_decoda

PROMPTS = ["Write a short story about a lighthouse keeper.", "Explain how a bicycle works.",
           "List three facts about the moon.", "def fibonacci(n):", "The capital of France is"]  # fmt: skip
# what each client picks from, one request at a time: every strategy family the engine batches
MIX: dict[str, dict] = {
    "greedy": {"temperature": 0},
    "sampling": {"temperature": 0.8, "top_p": 0.9, "top_k": 50},
    "n4": {"temperature": 0.9, "n": 4},
    "beam": {"num_beams": 4, "temperature": 0},
    "contrastive": {"penalty_alpha": 0.6, "top_k": 4, "temperature": 0},
    "dola": {"dola_layers": "high", "temperature": 0, "repetition_penalty": 1.2},
    "prompt_lookup": {"prompt_lookup_num_tokens": 4, "temperature": 0},
    "early_exit": {"assistant_early_exit": 8, "temperature": 0},
    "knobs": {"temperature": 0.7, "repetition_penalty": 1.3, "no_repeat_ngram_size": 3, "bad_words_ids": [[13]]},
    "json": {"temperature": 0, "response_format": {"type": "json_object"}},
}
HOSTILE_EVERY = 5.0  # seconds between hostile requests


def rss_mb(pid: int) -> float:
    match = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    return int(match.group(1)) / 1024 if match else float("nan")


def gauge(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(match.group(1)) if match else float("nan")


class Tally:
    def __init__(self) -> None:
        self.tokens = 0
        self.answers: Counter[tuple[str, str]] = Counter()  # (kind, status or exception)

    def note(self, kind: str, outcome: str, tokens: int = 0) -> None:
        self.answers[(kind, outcome)] += 1
        self.tokens += tokens


def at_rest(url: str) -> tuple[float, int]:
    """(KV pool share held, /health status) once every request ended and the gauges are at rest."""
    for _ in range(60):
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        if gauge(metrics, "decoda_num_requests_running") == gauge(metrics, "decoda_num_requests_waiting") == 0:
            break
        time.sleep(1)
    return gauge(metrics, "decoda_kv_cache_usage_perc"), httpx.get(f"{url}/health", timeout=10).status_code


def thirds(values: list[float]) -> tuple[float, float, float]:
    """Means of a series' first, middle and last third."""
    third = max(1, len(values) // 3)
    parts = (values[:third], values[third : 2 * third], values[-third:])
    return tuple(sum(part) / max(1, len(part)) for part in parts)


def print_rss(rss_series: list[float]) -> None:
    early, middle, late = thirds(rss_series)
    print(f"\nresident memory (mean over each third of the run): first {early:.0f} MB, middle {middle:.0f} MB, "
          f"last {late:.0f} MB (last / middle {late / middle:.2f}x)")  # fmt: skip


def print_answers(tally: Tally, expected: dict[str, str]) -> None:
    """Every answer by kind, then those other than the kind's expected status (200 unless named)."""
    print("\n| kind | answer | count |\n|---|---|---:|")
    for (kind, outcome), count in sorted(tally.answers.items()):
        print(f"| {kind} | {outcome} | {count} |")
    bad = {f"{k} {o}": n for (k, o), n in tally.answers.items() if o != expected.get(k, "200")}
    print("\nunexpected answers: " + (json.dumps(bad) if bad else "none"))


async def client_loop(http: httpx.AsyncClient, rng: random.Random, tally: Tally, deadline: float, tokens: int) -> None:
    while time.monotonic() < deadline:
        kind = rng.choice(list(MIX))
        body = {"max_tokens": tokens, "ignore_eos": kind not in ("json",), **MIX[kind]}
        if kind == "json":
            body["messages"] = [{"role": "user", "content": "Describe a cat as a JSON object."}]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = rng.choice(PROMPTS)
            path = "/v1/completions"
        try:
            r = await http.post(path, json=body)
            used = r.json().get("usage", {}).get("completion_tokens", 0) if r.status_code == 200 else 0
            tally.note(kind, str(r.status_code), used)
        except httpx.HTTPError as error:
            tally.note(kind, type(error).__name__)


async def hostile_loop(http: httpx.AsyncClient, url: str, tally: Tally, deadline: float) -> None:
    """A few hostile-but-valid and invalid requests, in turn, every HOSTILE_EVERY seconds."""
    turn = 0
    while time.monotonic() < deadline:
        await asyncio.sleep(HOSTILE_EVERY)
        kind = ("lists_at_limit", "list_over_limit", "huge_detect", "hang_up")[turn % 4]
        turn += 1
        try:
            if kind == "lists_at_limit":
                r = await http.post("/v1/completions", json=hostile_body(2, 32, seed=turn))
            elif kind == "list_over_limit":
                r = await http.post("/v1/completions", json={"prompt": "hi", "bad_words_ids": [[5]] * 5000})
            elif kind == "huge_detect":
                r = await http.post("/v1/watermark/detect", json={"text": "word " * 400_000, "watermarking_config": {}})
            else:
                async with http.stream("POST", "/v1/completions", json={"prompt": "Tell a story.", "max_tokens": 200,
                                       "stream": True, "ignore_eos": True}) as r:  # fmt: skip
                    async for _ in r.aiter_lines():
                        break  # the client leaves after the first event
            tally.note(f"hostile:{kind}", str(r.status_code))
        except httpx.HTTPError as error:
            tally.note(f"hostile:{kind}", type(error).__name__)


async def soak(url: str, pid: int, args: argparse.Namespace) -> tuple[Tally, list[float]]:
    tally, rss_series = Tally(), []
    deadline = time.monotonic() + args.minutes * 60
    limits = httpx.Limits(max_connections=args.clients + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        tasks = [asyncio.create_task(client_loop(http, random.Random(i), tally, deadline, args.max_tokens))
                 for i in range(args.clients)]  # fmt: skip
        tasks.append(asyncio.create_task(hostile_loop(http, url, tally, deadline)))
        started, last_tokens = time.monotonic(), 0
        print(f"CPU: {cpu_summary()}")
        print("| minute | tok/s | RSS MB | running | waiting | KV usage |\n|---:|---:|---:|---:|---:|---:|", flush=True)
        while not all(t.done() for t in tasks):
            await asyncio.sleep(args.interval)
            metrics = (await http.get("/metrics")).text
            rss_series.append(rss_mb(pid))
            window = (tally.tokens - last_tokens) / args.interval
            last_tokens = tally.tokens
            print(f"| {(time.monotonic() - started) / 60:.1f} | {window:.1f} | {rss_series[-1]:.0f} | "
                  f"{gauge(metrics, 'decoda_num_requests_running'):.0f} | "
                  f"{gauge(metrics, 'decoda_num_requests_waiting'):.0f} | "
                  f"{gauge(metrics, 'decoda_kv_cache_usage_perc'):.3f} |", flush=True)  # fmt: skip
        await asyncio.gather(*tasks)
    return tally, rss_series


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=15)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--interval", type=float, default=60)
    parser.add_argument(
        "--kv-cache-memory", default="1GiB",
        help="the server's KV pool; its pages become resident as blocks are first used, and the prefix "
        "cache keeps finished blocks until the pool is full, so resident memory rises by up to this "
        "much before it levels off (the default, 20%% of free memory, takes longer than a soak to fill)",
    )  # fmt: skip
    args = parser.parse_args()
    flags = ["--max-num-seqs", "64", "--max-model-len", "1024", "--kv-cache-memory", args.kv_cache_memory]
    print(f"server: decoda serve {' '.join(flags)}")
    with local_decoda(flags) as (url, proc):
        tally, rss_series = asyncio.run(soak(url, proc.pid, args))
        held, health = at_rest(url)
    print_rss(rss_series)
    print(f"KV blocks held when idle: {held:.3f} of the pool; /health {health}")
    print_answers(tally, {"hostile:list_over_limit": "400", "hostile:huge_detect": "400"})


if __name__ == "__main__":
    main()
