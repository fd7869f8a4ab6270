"""The paged KV cache's figures, in one run: prefix reuse, concurrency, multi-turn chat, memory.

1. ``prefix``: time to first token of a request sharing a ~1,500-token prefix with an earlier one
   (warm) against the first (cold), new prefixes each round.
2. ``concurrency``: output tokens/s and TTFT p50 at 16 and at 48 clients (128 streamed tokens).
3. ``chat``: multi-turn chat (every turn resends the conversation) against Decoda and
   ``transformers serve --continuous-batching``, the servers taking turns: TTFT p50 and tokens/s.
4. ``memory``: KV bytes held at 16 rows x 200 tokens against what a slot per row at full length
   (the cache before paging: 16 x (2048 + 32) positions) reserved. In process, exact.

    .venv/bin/python -m loadtests.bench_kv_cache [--parts prefix,concurrency,chat,memory]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from openai import AsyncOpenAI

from loadtests.compare import ROOT, TRANSFORMERS, converted_folder, free_port, stop_server, wait_ready, without_eos
from loadtests.loadgen import build_parser as loadgen_parser
from loadtests.loadgen import run_load

WORDS = "river stone cloud lamp orchard violin harbor meadow lantern copper garden thunder pebble".split()


def start(command: list[str], port: int, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(command, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)
    problem = wait_ready(f"http://127.0.0.1:{port}", proc, 300)
    if problem:
        proc.kill()
        raise SystemExit(f"{command[0]} {problem}; see {log}")
    return proc


def decoda(port: int, *flags: str) -> list[str]:
    return [sys.executable, "-m", "server.cli", "serve", "--port", str(port), "--num-threads", "2", *flags]


async def ttft(client: AsyncOpenAI, model: str, prompt: str) -> float:
    started = time.perf_counter()
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0, stream=True)
    first = None
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].text:
            first = time.perf_counter() - started
    return first if first is not None else time.perf_counter() - started


async def prefix_rounds(port: int, rounds: int) -> tuple[list[float], list[float]]:
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=600)
    cold, warm = [], []
    for round_ in range(rounds):
        rng = random.Random(round_)
        prefix = " ".join(rng.choice(WORDS) for _ in range(1500))  # ~1,500 tokens, new every round
        cold.append(await ttft(client, "smollm2-135m-instruct", prefix + " Question one?"))
        warm.append(await ttft(client, "smollm2-135m-instruct", prefix + " Another question?"))
        print(f"prefix round {round_}: cold TTFT {cold[-1]:.3f} s, warm {warm[-1]:.3f} s", flush=True)
    await client.close()
    return cold, warm


def prefix_part(logs: Path, rounds: int) -> None:
    port = free_port()
    proc = start(decoda(port), port, logs / "decoda-prefix.log")
    try:
        cold, warm = asyncio.run(prefix_rounds(port, rounds))
        ratio = statistics.median(w / c for w, c in zip(warm, cold, strict=True))
        print(f"PREFIX: cold TTFT p50 {statistics.median(cold):.3f} s, warm {statistics.median(warm):.3f} s, "
              f"warm/cold {ratio:.1%} (goal <= 10%)")  # fmt: skip
    finally:
        stop_server(proc)


def concurrency_part(logs: Path, per_client: int) -> None:
    port = free_port()
    rows = {}
    for label, flags in (
        ("paged, defaults", ()),
        ("16 rows, no prefix cache", ("--max-num-seqs", "16", "--no-prefix-caching")),
    ):
        proc = start(decoda(port, *flags), port, logs / "decoda-concurrency.log")
        try:
            warmup = loadgen_parser().parse_args(["--url", f"http://127.0.0.1:{port}", "--concurrency", "1",
                                                  "--requests", "1", "--max-tokens", "8"])  # fmt: skip
            asyncio.run(run_load(warmup))  # nobody pays lazy initialisation inside the measurement
            for concurrency in (16, 48):
                load = loadgen_parser().parse_args(["--url", f"http://127.0.0.1:{port}", "--concurrency",
                                                    str(concurrency), "--requests", str(concurrency * per_client),
                                                    "--max-tokens", "128"])  # fmt: skip
                summary = asyncio.run(run_load(load))
                rows[(label, concurrency)] = summary
                print(f"{label} c={concurrency}: {summary['output_tok_s']:.1f} tok/s, TTFT p50 "
                      f"{summary['ttft_p50']:.2f} s, errors {summary['errors']}", flush=True)  # fmt: skip
        finally:
            stop_server(proc)
    paged16, paged48 = rows[("paged, defaults", 16)], rows[("paged, defaults", 48)]
    print(f"CONCURRENCY: 48 clients {paged48['output_tok_s']:.1f} tok/s = "
          f"{paged48['output_tok_s'] / paged16['output_tok_s']:.2f}x the 16-client figure (goal >= 1.3x), "
          f"TTFT p50 {paged48['ttft_p50']:.2f} s (goal <= 1.5 s)")  # fmt: skip


async def chat_client(client: AsyncOpenAI, model: str, seed: int, turns: int, extra: dict) -> list[tuple[float, int]]:
    rng = random.Random(seed)
    system = "You are a helpful assistant. " + " ".join(rng.choice(WORDS) for _ in range(200))
    messages = [{"role": "system", "content": system}]
    results = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Tell me about the {rng.choice(WORDS)} (turn {turn})."})
        started, first, text, tokens = time.perf_counter(), None, "", 0
        stream = await client.chat.completions.create(model=model, messages=messages, max_tokens=48, temperature=0,
                                                      stream=True, extra_body=extra)  # fmt: skip
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter() - started
                text += chunk.choices[0].delta.content
                tokens += 1
        messages.append({"role": "assistant", "content": text})
        results.append((first or time.perf_counter() - started, tokens))
    return results


async def chat_load(url: str, model: str, clients: int, turns: int, extra: dict) -> dict:
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    started = time.perf_counter()
    per_client = await asyncio.gather(*(chat_client(client, model, i, turns, extra) for i in range(clients)))
    wall = time.perf_counter() - started
    flat = [r for rs in per_client for r in rs]
    return {"ttft_p50": statistics.median(t for t, _ in flat), "tok_s": sum(n for _, n in flat) / wall}


def chat_part(logs: Path, clients: int, turns: int, rounds: int) -> None:
    folder = converted_folder()
    transformers_cli = Path(sys.executable).parent / "transformers"
    servers = {"decoda": None}
    if folder is not None and transformers_cli.exists():
        servers[TRANSFORMERS] = folder
    else:
        print("chat: transformers serve skipped (no converted folder or no transformers CLI)")
    results: dict[str, list[dict]] = {name: [] for name in servers}
    for round_ in range(rounds):
        for name in servers if round_ % 2 == 0 else reversed(list(servers)):
            port = free_port()
            if name == "decoda":
                command, model, extra = decoda(port), "smollm2-135m-instruct", {"ignore_eos": True}
            else:
                view = without_eos(folder)
                command = [str(transformers_cli), "serve", "--continuous-batching", "--device", "cpu", "--dtype",
                           "float32", "--port", str(port), str(view)]  # fmt: skip
                model, extra = str(view), {}
            proc = start(command, port, logs / f"{name.split()[0]}-chat.log")
            try:
                result = asyncio.run(chat_load(f"http://127.0.0.1:{port}", model, clients, turns, extra))
            finally:
                stop_server(proc)
            results[name].append(result)
            print(f"chat round {round_} {name}: TTFT p50 {result['ttft_p50']:.2f} s, {result['tok_s']:.1f} tok/s",
                  flush=True)  # fmt: skip
    for name, runs in results.items():
        print(
            f"CHAT {name}: TTFT p50 {statistics.median(r['ttft_p50'] for r in runs):.2f} s, "
            f"{statistics.median(r['tok_s'] for r in runs):.1f} tok/s ({clients} clients x {turns} turns)"
        )


def memory_part() -> None:
    import torch

    from decoding.engine.core import Engine
    from decoding.engine.limits import EngineLimits
    from decoding.model.attention import register_attention
    from decoding.model.loading import load_model
    from decoding.model.packed_linear import pack_linears
    from decoding.params import GenerationParams

    torch.set_num_threads(2)
    loaded = load_model("smollm2-135m-instruct", attn_implementation=register_attention())
    pack_linears(loaded.model)
    limits = EngineLimits(max_model_len=2048, max_num_seqs=16, max_num_batched_tokens=512, kv_cache_bytes=2**30)
    engine = Engine(loaded.model, loaded.tokenizer, loaded.eos_token_ids, limits, lambda _: None, torch.device("cpu"))
    for i in range(16):
        engine.add_request(f"r{i}", [random.Random(i).randrange(3, 49152) for _ in range(180)],
                           GenerationParams(max_new_tokens=20, ignore_eos=True))  # fmt: skip
    held = 0
    with torch.inference_mode():
        while engine.has_work():
            engine.step()
            held = max(held, engine.pool.nbytes_held())
    per_token = engine.pool.nbytes() // (engine.pool.blocks.num_blocks * engine.pool.block_size)
    reserved = 16 * (2048 + 32) * per_token
    print(f"MEMORY: 16 rows x 200 tokens hold {held / 2**20:.1f} MiB of KV; a slot per row at full length "
          f"reserved {reserved / 2**20:.1f} MiB: {held / reserved:.1%} (goal <= 20%)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="prefix,concurrency,chat,memory")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--chat-clients", type=int, default=8)
    parser.add_argument("--chat-turns", type=int, default=4)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="decoda-kv-bench-"))
    parts = args.parts.split(",")
    print(f"server logs in {logs}", flush=True)
    if "memory" in parts:
        memory_part()
    if "prefix" in parts:
        prefix_part(logs, args.rounds)
    if "concurrency" in parts:
        concurrency_part(logs, args.requests_per_client)
    if "chat" in parts:
        chat_part(logs, args.chat_clients, args.chat_turns, args.rounds)


if __name__ == "__main__":
    main()
