"""Async load generator: N concurrent clients of the official ``openai`` SDK against one server.

It measures per request the time to first token (first content chunk), inter-token latencies
(gaps between content chunks), end-to-end latency, output tokens (from the usage chunk) and
errors, and reports aggregate output tokens/s with p50/p95 of each latency. Loopback only: the
URL must point at this machine. The run stops by itself after ``--requests`` requests or
``--duration`` seconds, whichever comes first. ``--prompt-file`` sends a long prompt instead of the
short ones (``prompts/tool_prompt.txt``: a tool-laden prompt of ~500 Qwen2.5 tokens), each request
with its own head so that no server serves it from a cached prefix: its TTFT is a prefill's.

    .venv/bin/python -m loadtests.loadgen --url http://127.0.0.1:8000 --concurrency 16 --requests 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from openai import AsyncOpenAI

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "Describe a walk through a forest in autumn.",
    "Write a letter to a friend about learning to cook.",
    "Tell me about the history of the printing press.",
    "Write a poem about the ocean at night.",
    "Explain why the sky is blue to a child.",
    "Describe your ideal weekend in the mountains.",
]


@dataclass
class RequestResult:
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    e2e: float = 0.0
    output_tokens: int = 0
    error: str | None = None


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(results: list[RequestResult], wall: float, concurrency: int) -> dict:
    ok = [r for r in results if r.error is None]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    itls = [gap for r in ok for gap in r.itls]
    e2es = [r.e2e for r in ok]
    tokens = sum(r.output_tokens for r in ok)
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "errors": len(results) - len(ok),
        "wall_s": wall,
        "output_tokens": tokens,
        "output_tok_s": tokens / wall if wall else 0.0,
        "tokens_per_request": tokens / len(ok) if ok else 0.0,
        "requests_s": len(ok) / wall if wall else 0.0,
        "ttft_p50": percentile(ttfts, 50),
        "ttft_p95": percentile(ttfts, 95),
        "itl_p50": percentile(itls, 50),
        "itl_p95": percentile(itls, 95),
        "e2e_p50": percentile(e2es, 50),
        "e2e_p95": percentile(e2es, 95),
        "first_error": next((r.error for r in results if r.error), None),
    }


def prompt_for(i: int, long_prompt: str | None, run: int) -> str:
    """Request ``i``'s prompt: the short ones in turn, or the long prompt after a head naming the request
    and the run, so that no server answers it from another request's cached prefix."""
    return PROMPTS[i % len(PROMPTS)] if long_prompt is None else f"Request {i} of run {run}: {long_prompt}"


async def one_request(client: AsyncOpenAI, model: str, prompt: str, args: argparse.Namespace) -> RequestResult:
    result = RequestResult()
    extra = json.loads(getattr(args, "extra_body", None) or "{}")  # a caller's Namespace may not have it
    if args.ignore_eos:
        extra["ignore_eos"] = True
    bias = {str(t): -100 for t in args.ban_tokens} or None  # portable way to force max_tokens
    start = time.perf_counter()
    try:
        if args.stream:
            stream = await client.completions.create(
                model=model, prompt=prompt, max_tokens=args.max_tokens, temperature=args.temperature,
                stream=True, stream_options={"include_usage": True}, extra_body=extra, logit_bias=bias,
            )  # fmt: skip
            last = None
            content_chunks = 0
            async for chunk in stream:
                now = time.perf_counter()
                if chunk.choices and chunk.choices[0].text:
                    content_chunks += 1
                    if result.ttft is None:
                        result.ttft = now - start
                    else:
                        result.itls.append(now - last)
                    last = now
                if chunk.usage is not None:
                    result.output_tokens = chunk.usage.completion_tokens
            if not result.output_tokens:  # servers that ignore stream_options: one chunk per token
                result.output_tokens = content_chunks
        else:
            out = await client.completions.create(
                model=model,
                prompt=prompt,
                max_tokens=args.max_tokens,
                temperature=args.temperature,
                extra_body=extra,
                logit_bias=bias,
            )
            result.output_tokens = out.usage.completion_tokens
    except Exception as exc:  # counted, never fatal to the run
        result.error = f"{type(exc).__name__}: {exc}"[:300]
    result.e2e = time.perf_counter() - start
    return result


async def run_load(args: argparse.Namespace) -> dict:
    host = urlparse(args.url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"refusing to send load to {host}: loopback only")
    client = AsyncOpenAI(base_url=args.url.rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=600)
    model = args.model or (await client.models.list()).data[0].id
    results: list[RequestResult] = []
    counter = iter(range(args.requests))
    deadline = time.perf_counter() + args.duration

    long_prompt = Path(args.prompt_file).read_text() if getattr(args, "prompt_file", None) else None
    run = time.monotonic_ns()

    async def worker() -> None:
        for i in counter:
            if time.perf_counter() > deadline:
                return
            results.append(await one_request(client, model, prompt_for(i, long_prompt, run), args))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    wall = time.perf_counter() - start
    await client.close()
    return summarize(results, wall, args.concurrency)


def format_table(rows: list[dict]) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.0f}"

    lines = [
        "| conc | requests | errors | tokens/req | output tok/s | TTFT p50/p95 ms | ITL p50/p95 ms | e2e p50/p95 s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        e2e = "-" if r["e2e_p50"] is None else f"{r['e2e_p50']:.2f} / {r['e2e_p95']:.2f}"
        lines.append(
            f"| {r['concurrency']} | {r['requests']} | {r['errors']} | {r['tokens_per_request']:.0f} | "
            f"{r['output_tok_s']:.1f} | "
            f"{ms(r['ttft_p50'])} / {ms(r['ttft_p95'])} | {ms(r['itl_p50'])} / {ms(r['itl_p95'])} | {e2e} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default=None, help="default: the first model the server lists")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--duration", type=float, default=300.0, help="stop starting requests after this many s")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="send extra_body ignore_eos (Decoda, vLLM) so every request produces max_tokens",
    )
    parser.add_argument(
        "--ban-tokens",
        type=lambda s: [int(t) for t in s.split(",") if t],
        default=[0, 2],
        help="token ids banned with logit_bias -100 (default: SmolLM2's eos ids 0,2), so every "
        "request produces max_tokens on any OpenAI-compatible server; empty to disable",
    )
    parser.add_argument("--extra-body", default=None, metavar="JSON",
                        help='more request fields, e.g. \'{"response_format": {"type": "json_object"}}\'')  # fmt: skip
    parser.add_argument(
        "--prompt-file",
        default=None,
        metavar="PATH",
        help="every request sends this text (after a head of its own, so no prefix is shared) instead of the "
        "short prompts, e.g. loadtests/prompts/tool_prompt.txt for a prompt's TTFT",
    )
    parser.add_argument("--json", default=None, help="also write the summary to this file")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    summary = asyncio.run(run_load(args))
    print(format_table([summary]))
    if summary["first_error"]:
        print("first error:", summary["first_error"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
