"""How long ``/health`` waits while the server tokenizes a long prompt (the event loop's stall).

Starts ``decoda serve`` from ``--root`` (default: this checkout; point it at an export of another
commit to compare), then, ``--rounds`` times, sends a ``--chars``-character prompt to
``--endpoint`` while a second client polls ``/health`` back to back, and reports the slowest
``/health`` answer of each round. The prompt is longer than the default context (2048 tokens), so
the server's whole work is: parse, tokenize (or render the chat template), answer 400; no
forward runs, and what stalls ``/health`` is the tokenizer alone.

    .venv/bin/python -m loadtests.bench_tokenize_stall --rounds 20
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from loadtests.compare import free_port, wait_ready

ROOT = Path(__file__).resolve().parent.parent
PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
MODEL = "smollm2-135m-instruct"  # named: older servers require the field
WORDS = "the quick brown fox jumps over a lazy dog near Paris the capital of France where".split()


def long_prompt(chars: int) -> str:
    rng = random.Random(0)
    text = ""
    while len(text) < chars:
        text += rng.choice(WORDS) + " "
    return text[:chars]


class HealthPoller(threading.Thread):
    """Polls ``/health`` back to back over one connection, keeping each call's (start, end)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.calls: list[tuple[float, float]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=30) as http:
            while not self.stopping.is_set():
                started = time.perf_counter()
                http.get(f"{self.url}/health")
                self.calls.append((started, time.perf_counter()))

    def slowest_between(self, start: float, end: float) -> float:
        """The longest call that overlapped [start, end], waiting for the one in flight at ``end``."""
        while not self.calls or self.calls[-1][1] < end:
            time.sleep(0.001)
        return max(done - began for began, done in self.calls if done >= start and began <= end)


def one_round(url: str, endpoint: str, prompt: str | None, http: httpx.Client, poller: HealthPoller) -> tuple:
    """(slowest /health in seconds during the request, the request's seconds, its status); no
    prompt: an idle span of the same kind, for the baseline."""
    started = time.perf_counter()
    if prompt is None:
        time.sleep(0.05)
        return poller.slowest_between(started, time.perf_counter()), 0.0, 0
    if endpoint == "chat":
        body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 1}
    else:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
    status = http.post(f"{url}{PATHS[endpoint]}", json=body).status_code
    ended = time.perf_counter()
    return poller.slowest_between(started, ended), ended - started, status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=str(ROOT), help="the checkout whose server/ and decoding/ run")
    parser.add_argument("--chars", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "server.cli", "serve", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(command, cwd=args.root)
    try:
        problem = wait_ready(url, proc, 300)
        if problem:
            raise SystemExit(f"server: {problem}")
        prompt = long_prompt(args.chars)
        # one client for the whole run: a fresh one builds an SSL context, which stalls this
        # process (and so the poller's clock) for longer than the server's tokenizer does
        poller = HealthPoller(url)
        poller.start()
        with httpx.Client(timeout=60) as http:
            http.get(f"{url}/health")
            time.sleep(0.5)  # both connections are open and warm
            idle = statistics.median(one_round(url, args.endpoint, None, http, poller)[0] for _ in range(10))
            rounds = [one_round(url, args.endpoint, prompt, http, poller) for _ in range(args.rounds)]
        poller.stopping.set()
    finally:
        proc.terminate()
        proc.wait(30)
    worst = [r[0] * 1000 for r in rounds]
    request_ms = statistics.median(r[1] for r in rounds) * 1000
    print(f"root {args.root}, {args.chars}-char prompt to {PATHS[args.endpoint]}, {args.rounds} rounds")
    print(f"request status {sorted({r[2] for r in rounds})}, request p50 {request_ms:.1f} ms")
    print(
        f"slowest /health per round: p50 {statistics.median(worst):.1f} ms, max {max(worst):.1f} ms "
        f"(idle server, slowest in a 50 ms span: p50 {idle * 1000:.1f} ms)"
    )


if __name__ == "__main__":
    main()
