"""What the Responses API costs over chat: tok/s of 16 clients on ``/v1/responses`` against the same
requests on ``/v1/chat/completions``, and the latency ``store: true`` adds (SQLite).

One Decoda server (the embedded SmolLM2, float32) with its responses store in a temporary folder.

1. Throughput: ``--concurrency`` clients, each sending ``--requests-per-client`` requests (the
   load generator's prompts, one user turn; ``--max-tokens`` tokens each, forced with ``ignore_eos``;
   temperature 0), streamed and not. The two endpoints take turns within each round (the order
   reversed every other round), so drift over minutes hits both; the ratio is responses / chat
   within a round (goal >= 0.95). Responses are stored, as OpenAI's default.
2. Store latency: one client, sequential, non-streamed short requests (``--latency-tokens``),
   ``store: true`` and ``store: false`` alternating request by request; p50 of each and the median
   of the paired differences (goal: <= 5 ms added at p50).

    .venv/bin/python -m loadtests.bench_responses --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from openai import AsyncOpenAI

from loadtests.compare import cpu_summary, local_decoda
from loadtests.loadgen import PROMPTS, RequestResult, percentile, summarize

ENDPOINTS = ("chat", "responses")
FORCED = {"ignore_eos": True}  # every request generates exactly its max tokens, on both endpoints


def mark_text(result: RequestResult, started: float, last: float | None) -> float:
    """One content event's time: the first is the TTFT, the next ones inter-token gaps."""
    now = time.perf_counter()
    if last is None:
        result.ttft = now - started
    else:
        result.itls.append(now - last)
    return now


async def chat_request(client: AsyncOpenAI, model: str, prompt: str, max_tokens: int, stream: bool) -> RequestResult:
    result, started = RequestResult(), time.perf_counter()
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "extra_body": FORCED}  # fmt: skip
    try:
        if stream:
            chunks = await client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True})
            last = None
            async for chunk in chunks:
                if chunk.choices and chunk.choices[0].delta.content:
                    last = mark_text(result, started, last)
                if chunk.usage is not None:
                    result.output_tokens = chunk.usage.completion_tokens
        else:
            out = await client.chat.completions.create(**body)
            result.output_tokens = out.usage.completion_tokens
    except Exception as exc:  # counted, never fatal to the run
        result.error = f"{type(exc).__name__}: {exc}"[:300]
    result.e2e = time.perf_counter() - started
    return result


async def responses_request(
    client: AsyncOpenAI, model: str, prompt: str, max_tokens: int, stream: bool, store: bool = True
) -> RequestResult:
    result, started = RequestResult(), time.perf_counter()
    body = {"model": model, "input": prompt, "max_output_tokens": max_tokens, "temperature": 0, "store": store,
            "extra_body": FORCED}  # fmt: skip
    try:
        if stream:
            events = await client.responses.create(**body, stream=True)
            last = None
            async for event in events:
                if event.type == "response.output_text.delta":
                    last = mark_text(result, started, last)
                elif event.type in ("response.completed", "response.incomplete"):
                    result.output_tokens = event.response.usage.output_tokens
                elif event.type == "response.failed":
                    result.error = f"response.failed: {event.response.error}"
        else:
            out = await client.responses.create(**body)
            result.output_tokens = out.usage.output_tokens
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:300]
    result.e2e = time.perf_counter() - started
    return result


def client_of(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)


async def load(url: str, model: str, endpoint: str, stream: bool, args: argparse.Namespace) -> dict:
    """``args.concurrency`` clients on one endpoint until the requests are spent: the load generator's summary."""
    results: list[RequestResult] = []
    counter = iter(range(args.concurrency * args.requests_per_client))
    one = chat_request if endpoint == "chat" else responses_request
    async with client_of(url) as client:

        async def worker() -> None:
            for i in counter:
                results.append(await one(client, model, PROMPTS[i % len(PROMPTS)], args.max_tokens, stream))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        wall = time.perf_counter() - started
    return summarize(results, wall, args.concurrency)


async def prompt_sizes(url: str, model: str) -> tuple[int, int]:
    """One request per endpoint (also the warm-up): their prompt tokens, which must be equal."""
    async with client_of(url) as client:
        chat = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": PROMPTS[0]}],
                                                    max_tokens=4, temperature=0)  # fmt: skip
        response = await client.responses.create(model=model, input=PROMPTS[0], max_output_tokens=4, temperature=0)
    return chat.usage.prompt_tokens, response.usage.input_tokens


async def store_latencies(url: str, model: str, args: argparse.Namespace) -> dict[bool, list[float]]:
    """Sequential non-streamed requests, ``store`` true and false alternating (pairs in turned order)."""
    seconds: dict[bool, list[float]] = {True: [], False: []}
    async with client_of(url) as client:
        for pair in range(args.latency_pairs):
            for store in (True, False) if pair % 2 == 0 else (False, True):
                result = await responses_request(client, model, PROMPTS[0], args.latency_tokens, False, store)
                if result.error:
                    raise SystemExit(f"store={store}: {result.error}")
                seconds[store].append(result.e2e)
    return seconds


def throughput_table(rows: dict[tuple[str, bool], list[dict]]) -> list[str]:
    lines = ["| mode | chat tok/s | responses tok/s | ratio (per round) | goal | tokens/req chat / responses |",
             "|---|---:|---:|---:|---|---:|"]  # fmt: skip
    for stream in (True, False):
        chat, responses = rows[("chat", stream)], rows[("responses", stream)]
        ratios = [r["output_tok_s"] / c["output_tok_s"] for r, c in zip(responses, chat, strict=True)]
        ratio = statistics.median(ratios)
        lines.append(
            f"| {'streamed' if stream else 'one body'} | {statistics.median(c['output_tok_s'] for c in chat):.1f} | "
            f"{statistics.median(r['output_tok_s'] for r in responses):.1f} | {ratio:.2f}x "
            f"({', '.join(f'{value:.2f}' for value in ratios)}) | {'met' if ratio >= 0.95 else 'NOT met'} (>= 0.95) | "
            f"{statistics.median(c['tokens_per_request'] for c in chat):.0f} / "
            f"{statistics.median(r['tokens_per_request'] for r in responses):.0f} |"
        )  # fmt: skip
    return lines


def store_table(seconds: dict[bool, list[float]]) -> list[str]:
    lines = ["| store | requests | p50 ms | p95 ms |", "|---|---:|---:|---:|"]
    for store in (False, True):
        lines.append(f"| {str(store).lower()} | {len(seconds[store])} | {percentile(seconds[store], 50) * 1000:.1f} | "
                     f"{percentile(seconds[store], 95) * 1000:.1f} |")  # fmt: skip
    added = (percentile(seconds[True], 50) - percentile(seconds[False], 50)) * 1000
    paired = statistics.median(t - f for t, f in zip(seconds[True], seconds[False], strict=True)) * 1000
    lines.append(f"\nstore: true adds {added:+.1f} ms at p50 (median paired difference {paired:+.1f} ms): "
                 f"goal <= 5 ms {'met' if added <= 5 else 'NOT met'}")  # fmt: skip
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--latency-pairs", type=int, default=30, help="store true/false request pairs")
    parser.add_argument("--latency-tokens", type=int, default=8)
    parser.add_argument("--num-threads", type=int, default=None, help="the server's torch threads")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    rows: dict[tuple[str, bool], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-responses-") as folder:
        store = Path(folder) / "responses.db"
        flags = ["--max-num-seqs", str(args.concurrency), "--max-model-len", "1024", "--max-queue",
                 str(4 * args.concurrency), "--responses-store", f"sqlite:///{store}"]  # fmt: skip
        flags += ["--num-threads", str(args.num_threads)] if args.num_threads else []
        with local_decoda(flags) as (url, _):
            model = "smollm2-135m-instruct"
            chat_prompt, responses_prompt = asyncio.run(prompt_sizes(url, model))
            if chat_prompt != responses_prompt:
                raise SystemExit(f"not the same request: chat's prompt is {chat_prompt} tokens, "
                                 f"the response's {responses_prompt}")  # fmt: skip
            for round_ in range(args.rounds):
                order = ENDPOINTS if round_ % 2 == 0 else ENDPOINTS[::-1]
                for stream in (True, False):
                    for endpoint in order:
                        summary = asyncio.run(load(url, model, endpoint, stream, args))
                        if summary["errors"]:
                            raise SystemExit(f"{endpoint} stream={stream}: {summary['first_error']}")
                        rows.setdefault((endpoint, stream), []).append(summary)
                        print(f"round {round_ + 1} {endpoint:9} {'streamed' if stream else 'one body'}: "
                              f"{summary['output_tok_s']:.1f} tok/s", flush=True)  # fmt: skip
            seconds = asyncio.run(store_latencies(url, model, args))
    print(f"\n{cpu_summary()}; {args.concurrency} clients x {args.requests_per_client} requests x {args.max_tokens} "
          f"tokens, {args.rounds} round(s); prompts {chat_prompt} tokens on both endpoints\n")  # fmt: skip
    print("\n".join(throughput_table(rows)))
    print(f"\none client, sequential, {args.latency_tokens} tokens per request, SQLite on {store.parent}:\n")
    print("\n".join(store_table(seconds)))


if __name__ == "__main__":
    main()
