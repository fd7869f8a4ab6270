"""Soak over every door clients use: minutes of chat, Responses conversations with tools, streamed
Messages and LoRA adapters at 64 clients, on one server with a SQLite store.

Each client picks, one request at a time, from ``KINDS``: a streamed chat completion; a Responses
conversation of two turns (a forced ``get_weather`` call, then its output sent back with
``previous_response_id``); a streamed Anthropic message; a completion on one of two adapters. Printed
every ``--interval`` seconds: the window's answers, resident memory, running/waiting requests, KV use
and the store's size (file bytes and stored responses). At the end: resident memory over the run's
thirds (it must level off once the KV pool's pages are touched), KV blocks held once idle (0), the
store's bytes per stored response over the thirds (bounded: a turn stores what it adds, not the whole
conversation again), and every answer by kind: all must be 200 and every stream must end with its
final event.

    .venv/bin/python -m loadtests.soak_apis --minutes 15 --clients 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import tempfile
import time
from pathlib import Path

import httpx

from loadtests.compare import cpu_summary, local_decoda
from loadtests.soak import PROMPTS, Tally, at_rest, gauge, print_answers, print_rss, rss_mb, thirds

MODEL = "smollm2-135m-instruct"
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"]}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.", "parameters": CITY}
KINDS = ("chat_stream", "responses_tools", "messages_stream", "adapter")


async def stream_ends(response: httpx.Response, final: str) -> bool:
    """Whether a 200 stream ended with its final event (``final`` appears in its last data line)."""
    last = ""
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            last = line
    return final in last


async def one(http: httpx.AsyncClient, kind: str, rng: random.Random, tokens: int) -> tuple[str, int]:
    """(outcome, completion tokens) of one request of ``kind``."""
    prompt = rng.choice(PROMPTS)
    if kind == "chat_stream":
        body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
                "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.7}  # fmt: skip
        async with http.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return str(r.status_code), 0
            return ("200" if await stream_ends(r, "[DONE]") else "cut"), tokens
    if kind == "messages_stream":
        body = {"model": MODEL, "max_tokens": tokens, "stream": True,
                "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
        async with http.stream("POST", "/v1/messages", json=body) as r:
            if r.status_code != 200:
                return str(r.status_code), 0
            return ("200" if await stream_ends(r, "message_stop") else "cut"), tokens
    if kind == "adapter":
        body = {"model": rng.choice(("a0", "a1")), "prompt": prompt, "max_tokens": tokens, "temperature": 0}
        r = await http.post("/v1/completions", json=body)
        return str(r.status_code), r.json()["usage"]["completion_tokens"] if r.status_code == 200 else 0
    first = await http.post("/v1/responses", json={
        "model": MODEL, "input": f"What is the weather in city number {rng.randrange(1000)}?", "tools": [WEATHER],
        "tool_choice": "required", "max_output_tokens": 96})  # fmt: skip
    if first.status_code != 200:
        return str(first.status_code), 0
    calls = [item for item in first.json()["output"] if item["type"] == "function_call"]
    if not calls:
        return "no_call", 0
    output = {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "sunny, 21 C"}
    second = await http.post("/v1/responses", json={
        "model": MODEL, "previous_response_id": first.json()["id"], "tools": [WEATHER], "max_output_tokens": tokens,
        "input": [output]})  # fmt: skip
    used = first.json()["usage"]["output_tokens"]
    return str(second.status_code), used + (second.json()["usage"]["output_tokens"] if second.status_code == 200 else 0)


async def client_loop(http: httpx.AsyncClient, rng: random.Random, tally: Tally, deadline: float, tokens: int) -> None:
    while time.monotonic() < deadline:
        kind = rng.choice(KINDS)
        try:
            outcome, used = await one(http, kind, rng, tokens)
            tally.note(kind, outcome, used)
        except (httpx.HTTPError, json.JSONDecodeError, KeyError) as error:
            tally.note(kind, type(error).__name__)


def store_size(db: Path) -> tuple[int, int]:
    """(bytes on disk, stored responses) of the SQLite store, read on a connection of its own."""
    size = sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as connection:
            rows = connection.execute("SELECT count(*) FROM responses").fetchone()[0]
    except sqlite3.Error:
        rows = 0
    return size, rows


async def soak(url: str, pid: int, db: Path, args: argparse.Namespace) -> tuple[Tally, list[tuple[float, int, int]]]:
    tally, series = Tally(), []
    deadline = time.monotonic() + args.minutes * 60
    limits = httpx.Limits(max_connections=args.clients + 8)
    async with httpx.AsyncClient(base_url=url, timeout=900, limits=limits) as http:
        tasks = [asyncio.create_task(client_loop(http, random.Random(i), tally, deadline, args.max_tokens))
                 for i in range(args.clients)]  # fmt: skip
        started, answered = time.monotonic(), 0
        print(f"CPU: {cpu_summary()}")
        print("| minute | answers | RSS MB | running | waiting | KV usage | store MB | stored |\n"
              "|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)  # fmt: skip
        while not all(t.done() for t in tasks):
            await asyncio.sleep(args.interval)
            metrics = (await http.get("/metrics")).text
            size, rows = store_size(db)
            series.append((rss_mb(pid), size, rows))
            total = sum(tally.answers.values())
            print(f"| {(time.monotonic() - started) / 60:.1f} | {total - answered} | {series[-1][0]:.0f} | "
                  f"{gauge(metrics, 'decoda_num_requests_running'):.0f} | "
                  f"{gauge(metrics, 'decoda_num_requests_waiting'):.0f} | "
                  f"{gauge(metrics, 'decoda_kv_cache_usage_perc'):.3f} | {size / 2**20:.1f} | {rows} |",
                  flush=True)  # fmt: skip
            answered = total
        await asyncio.gather(*tasks)
    return tally, series


def write_two_adapters(folder: Path) -> list[Path]:
    """Two seeded rank-8 PEFT adapters of the served model (loadtests.bench_lora's)."""
    from decoding.model.loading import load_model
    from loadtests.bench_lora import write_adapters

    return write_adapters(load_model(MODEL).model, folder, rank=8)[:2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=15)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--interval", type=float, default=60)
    parser.add_argument("--kv-cache-memory", default="1GiB")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        a0, a1 = write_two_adapters(Path(tmp))
        db = Path(tmp) / "responses.db"
        flags = ["--max-num-seqs", "64", "--max-model-len", "1024", "--kv-cache-memory", args.kv_cache_memory,
                 "--responses-store", f"sqlite:///{db}", "--lora-modules", f"a0={a0},a1={a1}"]
        print(f"server: decoda serve {' '.join(flags)}")
        with local_decoda(flags) as (url, proc):
            tally, series = asyncio.run(soak(url, proc.pid, db, args))
            held, health = at_rest(url)
    print_rss([rss for rss, _, _ in series])
    per_row = [size / rows for _, size, rows in series if rows]
    if per_row:
        b_early, b_middle, b_late = thirds(per_row)
        print(f"store bytes per stored response over the thirds: {b_early:.0f}, {b_middle:.0f}, {b_late:.0f}")
    print(f"KV blocks held when idle: {held:.3f} of the pool; /health {health}")
    print_answers(tally, {})

if __name__ == "__main__":
    main()
