"""The grammar budget on a busy machine: ordinary constrained requests beside CPU burner processes,
alone and beside one ambiguous-grammar request, in rounds.

The neighbours are the issue's: forced tool calls of ``{name: string, age: integer}`` (chat,
``tool_choice: "required"``), sampled, each client sending its requests one after another. CPU burner
processes (``--burners``, busy loops that end by themselves) load the machine the whole time. The
hostile request is ``s: s s | "a"`` with ``n`` rows forced long (as ``bench_hostile --kind grammar``),
sent once per "beside" load. The budget counts the masks' CPU time (``decoding/sampling/grammar.py``),
so no neighbour may be refused however busy the machine is, and the ambiguous request must still be.

Printed: the neighbours' output tok/s alone and beside the ambiguous request, their ratio (the goal:
≥ 0.9×), and every refusal (a neighbour's is a failure of the budget). One Decoda server (the embedded
SmolLM2, float32); the two modes take turns, order reversed every other round.

    .venv/bin/python -m loadtests.bench_grammar_budget --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import threading
import time

import httpx

from loadtests.compare import cpu_summary, local_decoda

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "record_person", "parameters": PERSON}}]
PEOPLE = ["Ada Lovelace, 36", "Alan Turing, 41", "Grace Hopper, 85", "Edsger Dijkstra, 72", "Barbara Liskov, 84"]


def neighbour_body(i: int, max_tokens: int) -> dict:
    return {"model": "smollm2-135m-instruct", "max_tokens": max_tokens, "temperature": 0.8, "seed": i,
            "messages": [{"role": "user", "content": f"Record this person: {PEOPLE[i % len(PEOPLE)]}."}],
            "tools": TOOLS, "tool_choice": "required"}  # fmt: skip


def ambiguous_body(n: int, max_tokens: int) -> dict:
    return {"prompt": "a", "max_tokens": max_tokens, "min_tokens": max_tokens, "n": n, "temperature": 0.8,
            "seed": 0, "structured_outputs": {"grammar": 'start: s\ns: s s | "a"\n'}}  # fmt: skip


async def neighbours(url: str, clients: int, requests: int, max_tokens: int) -> tuple[float, list[str]]:
    """(output tok/s over all clients, the refusals: any non-200 answer) of one load."""
    refusals: list[str] = []
    tokens = 0

    async def client(k: int, http: httpx.AsyncClient) -> None:
        nonlocal tokens
        for r in range(requests):
            response = await http.post(f"{url}/v1/chat/completions", json=neighbour_body(k * requests + r, max_tokens))
            if response.status_code != 200:
                refusals.append(f"{response.status_code} {response.text[:200]}")
                continue
            tokens += response.json()["usage"]["completion_tokens"]

    started = time.monotonic()
    async with httpx.AsyncClient(timeout=600) as http:
        await asyncio.gather(*(client(k, http) for k in range(clients)))
    return tokens / (time.monotonic() - started), refusals


def send_ambiguous(url: str, body: dict, outcome: list[str]) -> None:
    started = time.monotonic()
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    verdict = "refused" if response.status_code == 400 and "too ambiguous" in response.text else "NOT refused"
    outcome.append(f"{verdict} after {time.monotonic() - started:.1f} s ({response.status_code}): "
                   f"{response.text[:160]}")  # fmt: skip


def burners(count: int, seconds: float) -> list[subprocess.Popen]:
    burn = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass\n"
    return [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--burners", type=int, default=1, help="CPU burner processes beside the server")
    threads = "the server's torch threads (a pool thread the burners deschedule stalls every parallel op)"
    parser.add_argument("--num-threads", type=int, default=1, help=threads)
    parser.add_argument("--hostile-n", type=int, default=4, help="rows of the ambiguous request")
    parser.add_argument("--hostile-tokens", type=int, default=600)
    args = parser.parse_args()
    print(f"CPU: {cpu_summary()}; {args.burners} burner processes, {args.clients} clients", flush=True)
    results: dict[str, list[float]] = {"alone": [], "beside ambiguous": []}
    refused: list[str] = []
    flags = ["--max-num-seqs", str(args.clients + args.hostile_n), "--max-model-len", str(2 * args.hostile_tokens),
             "--num-threads", str(args.num_threads)]  # fmt: skip
    with local_decoda(flags) as (url, _):
        hot = burners(args.burners, 3600)
        try:
            for round_ in range(args.rounds):
                for mode in list(results) if round_ % 2 == 0 else list(results)[::-1]:
                    outcome: list[str] = []
                    sender = None
                    if mode != "alone":
                        body = ambiguous_body(args.hostile_n, args.hostile_tokens)
                        sender = threading.Thread(target=send_ambiguous, args=(url, body, outcome), daemon=True)
                        sender.start()
                    tok_s, refusals = asyncio.run(neighbours(url, args.clients, args.requests_per_client,
                                                             args.max_tokens))  # fmt: skip
                    if sender is not None:
                        sender.join(600)
                    results[mode].append(tok_s)
                    refused += refusals
                    print(f"round {round_ + 1} {mode}: {tok_s:.1f} tok/s, neighbours refused: {len(refusals)}"
                          + (f"; the ambiguous request {outcome[0]}" if outcome else ""), flush=True)  # fmt: skip
        finally:
            for burner in hot:
                burner.terminate()
    ratios = [b / a for b, a in zip(results["beside ambiguous"], results["alone"], strict=True)]
    print(f"\n| burners | clients | alone tok/s | beside the ambiguous request tok/s | ratio (per round) | "
          f"neighbours refused |\n|---:|---:|---:|---:|---:|---:|\n| {args.burners} | {args.clients} | "
          f"{statistics.median(results['alone']):.1f} | {statistics.median(results['beside ambiguous']):.1f} | "
          f"{statistics.median(ratios):.2f}x ({', '.join(f'{r:.2f}' for r in ratios)}) | {len(refused)} |")  # fmt: skip
    for refusal in refused:
        print(f"  refused neighbour: {refusal}")


if __name__ == "__main__":
    main()
