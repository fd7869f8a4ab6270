"""Priorities and fair shares under load: a high-priority client's TTFT beside 32 long low-priority
requests, and a small caller's throughput beside another caller's burst of 64.

Part ``ttft`` (goal: loaded TTFT p50 <= 1.5x idle): one ``decoda serve --scheduling-policy priority``
(the embedded SmolLM2). A client sends ``--requests`` streamed completions one after another
(``priority`` 0, ``--high-tokens`` tokens each) and times each first token:

- ``idle``: nothing else runs;
- ``loaded``: 32 streamed requests of ``priority`` 10 (``--low-tokens`` tokens each, long enough to run
  through the measurement) are all decoding first;
- ``loaded, no priority``: the same 32 at ``priority`` 0, the client's too: what first come first served
  gives the same client (the contrast, not a goal).

Part ``share`` (goal: the small caller's tok/s beside the burst >= 0.8x alone): one server with two API
keys (each key is a caller, weight 1). The small caller keeps 4 requests in flight for ``--seconds``
(closed loop, ``--share-tokens`` tokens each; its tok/s counts the tokens that arrive within the
window), alone and then beside the big caller's 64 in flight (closed
loop, started first and running throughout), once per ``--fair-share`` mode (``rows``, ``steps``: both by
default), the servers taking turns; both callers' tokens/s beside each other say what the share costs
the engine. ``--baseline REF`` runs the same part against Decoda at git
``REF`` too (its line is one first-come-first-served queue), taking turns.

Servers run one torch thread (``--num-threads 1``) unless told otherwise: on a 2-core machine that
leaves a core to the clients. The phases take turns within each of ``--rounds`` rounds (the order
reversed every other round), and ratios are taken within a round. Prints the tables; writes nothing.

    .venv/bin/python -m loadtests.bench_priority --rounds 2 [--parts ttft,share] [--baseline REF]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from openai import APIError, AsyncOpenAI

from loadtests.compare import ROOT, baseline_checkout, cpu_summary, local_decoda
from loadtests.loadgen import percentile

PROMPT = "Write a long, detailed story about a lighthouse keeper and the ships that pass in the night. "
HIGH_PROMPT = "Say hello to the new visitor."
BIG, SMALL = "sk-bench-big", "sk-bench-small"


def client(url: str, key: str = "none") -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=600)


async def streamed(api: AsyncOpenAI, prompt: str, tokens: int, extra: dict, started: asyncio.Event | None = None,
                   arrivals: list[float] | None = None) -> tuple[float | None, int]:  # fmt: skip
    """(seconds to the first token, tokens received) of one streamed completion of exactly ``tokens`` tokens;
    each token's arrival time goes into ``arrivals``."""
    begin = time.perf_counter()
    ttft, count = None, 0
    stream = await api.completions.create(model="smollm2-135m-instruct", prompt=prompt, max_tokens=tokens,
                                          stream=True, extra_body={"ignore_eos": True, **extra})  # fmt: skip
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            count += 1
            now = time.perf_counter()
            if arrivals is not None:
                arrivals.append(now)
            if ttft is None:
                ttft = now - begin
                if started is not None:
                    started.set()
    return ttft, count


# ---- part ttft -------------------------------------------------------------------------------------------
async def high_ttfts(url: str, args: argparse.Namespace, low_priority: int | None) -> list[float]:
    """The high client's TTFTs, with 32 requests of ``low_priority`` decoding beside it (None: idle)."""
    api = client(url)
    lows: list[asyncio.Task] = []
    if low_priority is not None:
        events = [asyncio.Event() for _ in range(32)]
        lows = [asyncio.create_task(streamed(api, PROMPT * 3, args.low_tokens, {"priority": low_priority}, event))
                for event in events]  # fmt: skip
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in events)), 300)
    ttfts = []
    try:
        for _ in range(args.requests):
            ttft, _ = await streamed(api, HIGH_PROMPT, args.high_tokens, {"priority": 0})
            ttfts.append(ttft)
        if lows and any(task.done() for task in lows):
            raise SystemExit("a low-priority request ended during the measurement: raise --low-tokens")
    finally:
        for task in lows:
            task.cancel()
        await asyncio.gather(*lows, return_exceptions=True)
        await api.close()
    return ttfts


def part_ttft(args: argparse.Namespace, logs: Path) -> None:
    phases = {"idle": None, "loaded": 10, "loaded, no priority": 0}
    rows: dict[str, list[float]] = {name: [] for name in phases}
    ratios: list[float] = []
    flags = ["--scheduling-policy", "priority", "--num-threads", str(args.num_threads)]
    with local_decoda(["--max-model-len", "2048", *flags], 600, log=logs / "bench_priority_ttft.log") as (url, _):
        asyncio.run(high_ttfts(url, argparse.Namespace(**{**vars(args), "requests": 2}), None))  # warm-up
        for round_index in range(args.rounds):
            order = list(phases) if round_index % 2 == 0 else list(reversed(phases))
            p50 = {}
            for name in order:
                ttfts = asyncio.run(high_ttfts(url, args, phases[name]))
                rows[name] += ttfts
                p50[name] = statistics.median(ttfts)
                print(f"round {round_index + 1} {name}: TTFT p50 {p50[name] * 1000:.0f} ms", flush=True)
            ratios.append(p50["loaded"] / p50["idle"])
    print(f"\n## A priority-0 client's TTFT beside 32 long priority-10 requests ({args.requests} requests x "
          f"{args.rounds} rounds, {args.high_tokens} tokens each; the 32: {args.low_tokens} tokens)\n")  # fmt: skip
    print("| phase | TTFT p50 (ms) | TTFT p95 (ms) |\n|---|---|---|")
    for name, ttfts in rows.items():
        print(f"| {name} | {percentile(ttfts, 50) * 1000:.0f} | {percentile(ttfts, 95) * 1000:.0f} |")
    print(f"\nloaded / idle p50 within rounds: {', '.join(f'{r:.2f}x' for r in ratios)}; "
          f"median {statistics.median(ratios):.2f}x (goal <= 1.5x)")  # fmt: skip


# ---- part share ------------------------------------------------------------------------------------------
async def closed_loop(api: AsyncOpenAI, tokens: int, until: float, arrivals: list[float], ttfts: list[float]) -> None:
    """Requests one after another until ``until`` (the last one runs to its end)."""
    while time.perf_counter() < until:
        ttft, _ = await streamed(api, PROMPT, tokens, {}, arrivals=arrivals)
        if ttft is not None:
            ttfts.append(ttft)


async def small_caller(url: str, args: argparse.Namespace, with_burst: bool) -> tuple[float, float, float]:
    """(the small caller's tokens/s, its TTFT p50, the big caller's tokens/s) over ``--seconds``, beside the big
    caller's burst or alone."""
    big, small = client(url, BIG), client(url, SMALL)
    burst: list[asyncio.Task] = []
    stop = asyncio.Event()
    big_arrivals: list[float] = []

    async def big_client() -> None:
        while not stop.is_set():
            with contextlib.suppress(APIError):  # a refusal only thins the burst; the small caller is measured
                await streamed(big, PROMPT, args.share_tokens, {}, arrivals=big_arrivals)

    try:
        if with_burst:
            burst = [asyncio.create_task(big_client()) for _ in range(64)]
            await asyncio.sleep(args.warm_seconds)  # the burst fills the batch first
        arrivals: list[float] = []
        ttfts: list[float] = []
        begin = time.perf_counter()
        until = begin + args.seconds
        await asyncio.gather(*(closed_loop(small, args.share_tokens, until, arrivals, ttfts) for _ in range(4)))
        in_window = sum(1 for at in arrivals if at <= until)  # tokens that arrived within the measurement
        big_in_window = sum(1 for at in big_arrivals if begin <= at <= until)
        ttft = statistics.median(ttfts) if ttfts else float("nan")
        return in_window / (until - begin), ttft, big_in_window / (until - begin)
    finally:
        stop.set()
        for task in burst:
            task.cancel()
        await asyncio.gather(*burst, return_exceptions=True)
        await big.close()
        await small.close()


def part_share(args: argparse.Namespace, logs: Path) -> None:
    modes = args.fair_share.split(",")
    servers = {f"this checkout, --fair-share {mode}": (ROOT, ["--fair-share", mode]) for mode in modes}
    if args.baseline:
        tree = baseline_checkout(args.baseline)
        if isinstance(tree, str):
            raise SystemExit(tree)
        servers[f"Decoda@{args.baseline}"] = (tree, [])
    try:
        share_rounds(args, logs, servers)
    finally:
        if args.baseline:
            subprocess.run(["git", "worktree", "remove", "--force", str(servers[f"Decoda@{args.baseline}"][0])],
                           cwd=ROOT, check=False)  # fmt: skip


def share_rounds(args: argparse.Namespace, logs: Path, servers: dict[str, tuple[Path, list[str]]]) -> None:
    """``servers``: name -> (the checkout it runs, its own flags)."""
    results: dict[str, list[tuple[float, float, float, float, float]]] = {name: [] for name in servers}
    flags = ["--api-key", f"{BIG},{SMALL}", "--num-threads", str(args.num_threads)]
    for round_index in range(args.rounds):
        names = list(servers) if round_index % 2 == 0 else list(reversed(servers))
        for name in names:
            root, own = servers[name]
            log = logs / f"bench_priority_share_{len(results[name])}_{list(servers).index(name)}.log"
            with local_decoda(["--max-model-len", "2048", *flags, *own], 600, root=root, log=log) as (url, _):
                asyncio.run(small_caller(url, argparse.Namespace(**{**vars(args), "seconds": 3}), False))  # warm-up
                alone = asyncio.run(small_caller(url, args, False))
                shared = asyncio.run(small_caller(url, args, True))
            results[name].append((alone[0], alone[1], shared[0], shared[1], shared[0] + shared[2]))
            print(f"round {round_index + 1} {name}: small caller alone {alone[0]:.1f} tok/s, beside the burst "
                  f"{shared[0]:.1f} tok/s ({shared[0] / alone[0]:.2f}x); both callers "
                  f"{shared[0] + shared[2]:.1f} tok/s", flush=True)  # fmt: skip
    print(f"\n## A caller keeping 4 requests in flight beside another keeping 64 ({args.share_tokens} tokens each, "
          f"{args.seconds:.0f} s per phase, {args.rounds} rounds)\n")  # fmt: skip
    print("| server | alone tok/s | beside the burst tok/s | ratio (median of rounds) | TTFT p50 alone / beside (ms) "
          "| both callers' tok/s beside |")
    print("|---|---|---|---|---|---|")
    for name, rounds in results.items():
        ratio = statistics.median(r[2] / r[0] for r in rounds)
        alone = statistics.median(r[0] for r in rounds)
        shared = statistics.median(r[2] for r in rounds)
        ttft_alone = statistics.median(r[1] for r in rounds) * 1000
        ttft_shared = statistics.median(r[3] for r in rounds) * 1000
        both = statistics.median(r[4] for r in rounds)
        print(f"| {name} | {alone:.1f} | {shared:.1f} | {ratio:.2f}x | {ttft_alone:.0f} / {ttft_shared:.0f} "
              f"| {both:.1f} |")
    print("\ngoal: this checkout's ratio >= 0.8x (both callers' tok/s: what the share costs the engine)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="ttft,share")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=12, help="the high client's requests per phase")
    parser.add_argument("--high-tokens", type=int, default=8)
    parser.add_argument("--low-tokens", type=int, default=1500)
    parser.add_argument("--share-tokens", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0, help="the small caller's measurement per phase")
    parser.add_argument("--warm-seconds", type=float, default=10.0, help="the burst's head start")
    parser.add_argument("--baseline", help="git ref of a Decoda to run part share against too")
    parser.add_argument("--fair-share", default="rows,steps",
                        help="part share: this checkout once per --fair-share mode listed, taking turns")  # fmt: skip
    parser.add_argument("--num-threads", type=int, default=1,
                        help="the servers' torch threads: 1 leaves a core to the clients on a 2-core machine, and a "
                             "2-thread OpenMP team next to other work slows down many times over")  # fmt: skip
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="bench-priority-"))
    print(f"machine: {cpu_summary()}; load average {os.getloadavg()[0]:.1f}; server logs in {logs}", flush=True)
    parts = args.parts.split(",")
    if "ttft" in parts:
        part_ttft(args, logs)
    if "share" in parts:
        part_share(args, logs)


if __name__ == "__main__":
    main()
