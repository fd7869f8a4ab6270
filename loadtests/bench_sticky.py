"""Sticky routing against round robin: two replicas behind real nginx, 4-turn conversations from 8 clients.

Two ``decoda serve`` replicas (the embedded SmolLM2, one torch thread each) and two nginx processes in
front of the same two replicas, taking turns over ``--rounds`` rounds (the order reversed every other
round, since this machine's speed drifts):

- ``sticky``: ``deploy/nginx.conf`` as shipped; each conversation sends its id as ``prompt_cache_key``,
  which ``deploy/nginx_session.js`` hashes (consistently) to one replica;
- ``round robin``: the same file with the session routing off (``location /`` proxies to the replicas
  directly) and ``least_conn`` removed: nginx's plain round robin, the same requests and keys.

Each of ``--clients`` clients runs ``--conversations`` conversations one after another: a system prompt,
then 4 user turns, each streamed with the whole conversation so far (chat completions, ``temperature``
0, exactly ``--max-tokens`` tokens a reply). Every conversation starts with its own id, so its tokens
are its own from the first block: what one replica's cache holds of it, it computed for it.
Measured on turns 2-4: the prefix-cache hit rate (prompt tokens the cache supplied over prompt tokens,
from each answer's ``usage.prompt_tokens_details.cached_tokens``, vLLM's hits/queries), the share of the
conversation before the turn that was reused (cached tokens over the previous turn's prompt and reply),
and the client's time to first token (p50, p95); from nginx's access log, how many conversations
began on each replica (with a handful of sessions, a consistent hash can load one replica with most).
Writes ``loadtests/results/sticky.md``.

``--kv-cache-memory`` sizes each replica's KV cache (the server's flag). By default it holds every
conversation many times over, so round robin loses only each conversation's first visit to the other
replica (at most a third of turns 2-4 with two replicas). A production replica's cache holds far fewer
conversations than its fleet serves; round robin then makes every replica hold every conversation, while
sticky routing gives each replica only its share, which is where the routing pays most.

    .venv/bin/python -m loadtests.bench_sticky --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from openai import AsyncOpenAI

from tests.test_e2e_openai import MODEL, ROOT, free_port, start_server, stop_server
from tests.test_lb_nginx_drain import NGINX, nginx_conf, wait_ready

RESULTS = ROOT / "loadtests" / "results"
STICKY, ROUND_ROBIN = "sticky", "round robin"
SUBFOLDER = {STICKY: "sticky", ROUND_ROBIN: "rr"}  # each mode's nginx: its config and access log
SYSTEM = (
    "You are the support assistant of a small bicycle shop. You answer questions about city bikes, "
    "road bikes, cargo bikes and their repair. Keep every answer friendly, practical and short: one or two "
    "sentences, no lists. When a question is about safety (brakes, tyres, lights), say so first. If a "
    "customer asks about prices, say that they depend on the model and invite them to the shop. The shop "
    "is open from nine to six on weekdays and from ten to four on Saturdays; it is closed on Sundays. "
    "Repairs usually take two days; a puncture is fixed while the customer waits. Never invent a brand."
)
PARTS = [
    "brake pads", "chain", "rear derailleur", "front hub", "tyre", "inner tube", "headset", "bottom bracket",
    "cassette", "dynamo light", "cargo box", "kickstand", "saddle clamp", "spoke", "brake cable", "crank arm",
]  # fmt: skip
FIXES = [
    "was cleaned and greased", "was replaced with a new one", "was trued and tensioned",
    "was adjusted by a quarter turn", "was checked and found worn", "was tightened to five newton metres",
    "was swapped for the customer's own part",
]  # fmt: skip


def repair_log(key: str, words: int) -> str:
    """A conversation's own reference document of about ``words`` words (a repair log that varies line by line):
    the long shared context of a real assistant's conversation (a manual, a file, a ticket history), which is
    what a replica's prefix cache saves on later turns; seeded by the conversation's key, so no two
    conversations share it beyond the shop's system prompt."""
    seed = int(key[:8], 16)
    lines, count, number = [], 0, 0
    while count < words:
        number += 1
        line = (
            f"Ticket {seed % 9000 + number}: the {PARTS[(seed + number * 7) % len(PARTS)]} of bike "
            f"{(seed >> 4) % 500 + number * 3} {FIXES[(seed + number * 5) % len(FIXES)]} on day {number % 28 + 1}."
        )
        lines.append(line)
        count += len(line.split())
    return " ".join(lines)


QUESTIONS = [
    "My rear brake squeaks when it rains. What should I check first?",
    "And if the pads look fine, what else could it be?",
    "How long would the shop need to look at it?",
    "Can I still ride it to work tomorrow?",
]


@dataclass
class Turn:
    number: int
    ttft: float
    prompt_tokens: int
    cached_tokens: int
    before: int  # the conversation's tokens before this turn: the previous prompt and its reply


@dataclass
class ModeResult:
    turns: list[Turn] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    keys: list[str] = field(default_factory=list)  # each conversation's; its requests' ids are key-turn
    first_replicas: str = ""  # conversations whose first turn each replica served, most first ("5/3")


def round_robin(conf: Path) -> Path:
    """``conf`` (deploy/nginx.conf as the tests render it) with the session routing off and plain round robin
    instead of least connections."""
    text = conf.read_text()
    for old, new in (("js_content session.route;", "proxy_pass http://decoda;"), ("least_conn;", "")):
        assert old in text, old
        text = text.replace(old, new)
    conf.write_text(text)
    return conf


async def conversation(client: AsyncOpenAI, args: argparse.Namespace, result: ModeResult) -> None:
    key = uuid.uuid4().hex
    result.keys.append(key)
    system = f"Conversation {key}. {SYSTEM}"
    if args.document_words:
        system += f" The shop's repair log for this customer follows. {repair_log(key, args.document_words)}"
    messages = [{"role": "system", "content": system}]
    before = 0
    for number, question in enumerate(QUESTIONS, start=1):
        messages.append({"role": "user", "content": question})
        start = time.perf_counter()
        ttft, text, usage = None, [], None
        try:
            stream = await client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=args.max_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body={"prompt_cache_key": key, "ignore_eos": True},
                extra_headers={"X-Request-Id": f"{key}-{number}"},
            )  # fmt: skip
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    text.append(chunk.choices[0].delta.content)
                usage = chunk.usage or usage
        except Exception as exc:  # counted, never fatal to the run
            result.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            return
        details = usage.prompt_tokens_details
        cached = details.cached_tokens if details and details.cached_tokens else 0
        result.turns.append(Turn(number, ttft or 0.0, usage.prompt_tokens, cached, before))
        before = usage.prompt_tokens + usage.completion_tokens
        messages.append({"role": "assistant", "content": "".join(text)})


async def run_mode(url: str, args: argparse.Namespace) -> ModeResult:
    result = ModeResult()
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)

    async def one_client() -> None:
        for _ in range(args.conversations):
            await conversation(client, args, result)

    started = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(args.clients)))
    result.seconds = time.perf_counter() - started
    await client.close()
    return result


def first_replicas(access_log: Path, keys: list[str]) -> str:
    """How many of the conversations ``keys`` each replica served the first turn of, most first, from nginx's
    access log (``upstream=ADDRESS request_id=KEY-1``): "5/3" for five on one replica and three on the other."""
    deadline = time.monotonic() + 10  # nginx logs a request once its answer has gone out
    while True:
        lines = re.findall(r"upstream=(\S+) request_id=([0-9a-f]{32})-1$", access_log.read_text(), re.M)
        served = {key: upstream for upstream, key in lines}
        if all(key in served for key in keys) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    counts = sorted(Counter(served[key] for key in keys if key in served).values(), reverse=True)
    return "/".join(str(count) for count in counts + [0] * (2 - len(counts)))


def summary(result: ModeResult) -> dict[str, float]:
    later = [turn for turn in result.turns if turn.number >= 2]
    ttfts = sorted(turn.ttft for turn in later)
    last = [turn.prompt_tokens for turn in result.turns if turn.number == len(QUESTIONS)]
    return {
        "hit_rate": sum(t.cached_tokens for t in later) / max(1, sum(t.prompt_tokens for t in later)),
        "reused": sum(t.cached_tokens for t in later) / max(1, sum(t.before for t in later)),
        "ttft_p50": statistics.median(ttfts) if ttfts else float("nan"),
        "ttft_p95": ttfts[int(0.95 * (len(ttfts) - 1))] if ttfts else float("nan"),
        "first_ttft_p50": statistics.median(t.ttft for t in result.turns if t.number == 1) if result.turns else 0,
        "prompt_mean": statistics.mean(t.prompt_tokens for t in later) if later else 0,
        "last_prompt_mean": statistics.mean(last) if last else 0.0,
        "turns": len(later),
        "errors": len(result.errors),
        "seconds": result.seconds,
        "first_replicas": result.first_replicas,
    }


def cache_tokens(log: Path) -> int:
    """Positions one replica's KV cache holds, from its ``engine ready`` log line (blocks x block size)."""
    match = re.search(r"kv_cache=\d+ MiB \((\d+) blocks of (\d+)", log.read_text())
    if match is None:
        raise SystemExit(f"no 'engine ready' line with the KV cache's size in {log}")
    return int(match.group(1)) * int(match.group(2))


def cache_line(args: argparse.Namespace, tokens: int, rounds: list[dict[str, dict[str, float]]]) -> str:
    """The replicas' KV cache in positions and in conversations at their last turn (prompt and reply)."""
    last = max(modes[STICKY]["last_prompt_mean"] for modes in rounds) + args.max_tokens if rounds else 0
    holds = f", about {tokens / last:.1f} conversations at their last turn ({last:.0f} positions)" if last else ""
    flag = f"--kv-cache-memory {args.kv_cache_memory}" if args.kv_cache_memory else "the default --kv-cache-memory"
    return f"Each replica's KV cache ({flag}): {tokens} positions{holds}; {args.clients} conversations run at once."


def report(rounds: list[dict[str, dict[str, float]]], args: argparse.Namespace, load: str, tokens: int) -> str:
    lines = [
        "# Sticky routing against round robin (two replicas behind nginx)",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; load average before the run: {load}; {args.clients} clients x "
        f"{args.conversations} conversations x 4 turns per mode and round, {args.max_tokens} tokens a reply, "
        f"{args.document_words} words of repair log in each conversation's system prompt, "
        f"SmolLM2-135M float32, two replicas with --num-threads 1, the modes taking turns over {len(rounds)} rounds.",
        "",
        cache_line(args, tokens, rounds),
        "",
        "Conversations per replica: how many began on each (round robin's later turns move). Turns 2-4 only. "
        "hit rate: prompt tokens from the prefix cache / prompt tokens; reused: those / the conversation's tokens "
        "before the turn (its previous prompt and reply).",
        "",
        "| round | mode | conversations per replica | hit rate | reused | TTFT p50 | TTFT p95 | turn-1 TTFT p50 "
        "| mean prompt | turns | errors | wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for number, modes in enumerate(rounds, start=1):
        for mode, s in modes.items():
            ms = {name: f"{s[name] * 1e3:.0f} ms" for name in ("ttft_p50", "ttft_p95", "first_ttft_p50")}
            lines.append(f"| {number} | {mode} | {s['first_replicas']} | {s['hit_rate']:.1%} | {s['reused']:.1%} "
                         f"| {ms['ttft_p50']} "
                         f"| {ms['ttft_p95']} | {ms['first_ttft_p50']} | {s['prompt_mean']:.0f} | {s['turns']} "
                         f"| {s['errors']} | {s['seconds']:.0f} s |")  # fmt: skip
    ratios = [modes[STICKY]["ttft_p50"] / modes[ROUND_ROBIN]["ttft_p50"] for modes in rounds]
    sticky_hits = [modes[STICKY]["hit_rate"] for modes in rounds]
    lines += [
        "",
        f"TTFT p50 of turns 2-4, sticky / round robin, within each round: {', '.join(f'{r:.2f}x' for r in ratios)} "
        f"(median {statistics.median(ratios):.2f}x; goal <= 0.6x). Sticky hit rate: "
        f"{', '.join(f'{h:.1%}' for h in sticky_hits)} (goal >= 90%).",
        "",
        f"Command: `.venv/bin/python -m loadtests.bench_sticky --rounds {args.rounds} --clients {args.clients} "
        f"--conversations {args.conversations} --max-tokens {args.max_tokens} --document-words {args.document_words}"
        + (f" --kv-cache-memory {args.kv_cache_memory}`" if args.kv_cache_memory else "`"),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--conversations", type=int, default=2, help="per client, per mode and round")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--document-words", type=int, default=0,
                        help="a repair log of about this many words in each conversation's system prompt: the long "
                             "context (a manual, a file) whose reuse sticky routing saves")  # fmt: skip
    parser.add_argument("--kv-cache-memory", default=None,
                        help="each replica's KV cache (the server's flag, e.g. 400MB); default: the server's")
    parser.add_argument("--out", type=Path, default=RESULTS / "sticky.md")
    args = parser.parse_args()
    if NGINX is None:
        raise SystemExit("needs nginx with njs (Debian packages nginx and libnginx-mod-http-js)")
    load = Path("/proc/loadavg").read_text().split()[:3]
    folder = Path(tempfile.mkdtemp(prefix="decoda-sticky-"))
    cache = ("--kv-cache-memory", args.kv_cache_memory) if args.kv_cache_memory else ()
    replicas = [start_server("--max-model-len", "2048", "--num-threads", "1", *cache, log=folder / f"replica-{i}.log")
                for i in range(2)]  # fmt: skip
    tokens = cache_tokens(folder / "replica-0.log")
    ports = [int(base.rsplit(":", 1)[1]) for base, _ in replicas]
    for sub in SUBFOLDER.values():
        (folder / sub).mkdir()
    urls, proxies = {}, []
    try:
        for mode, sub in SUBFOLDER.items():
            listen = free_port()
            conf = nginx_conf(folder / sub, listen, ports)
            if mode == ROUND_ROBIN:
                conf = round_robin(conf)
            proxies.append(subprocess.Popen([NGINX, "-p", str(conf.parent), "-c", str(conf), "-g", "daemon off;"]))
            urls[mode] = f"http://127.0.0.1:{listen}"
            wait_ready(urls[mode])
        rounds = []
        for number in range(args.rounds):
            order = [STICKY, ROUND_ROBIN] if number % 2 == 0 else [ROUND_ROBIN, STICKY]
            modes = {}
            for mode in order:
                result = asyncio.run(run_mode(urls[mode], args))
                result.first_replicas = first_replicas(folder / SUBFOLDER[mode] / "access.log", result.keys)
                modes[mode] = summary(result)
                print(f"round {number + 1} {mode}: {modes[mode]}", flush=True)
            rounds.append({mode: modes[mode] for mode in (STICKY, ROUND_ROBIN)})
    finally:
        for proxy in proxies:
            proxy.send_signal(signal.SIGQUIT)
            proxy.wait(10)
        for _, proc in replicas:
            stop_server(proc)
    text = report(rounds, args, " ".join(load), tokens)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
