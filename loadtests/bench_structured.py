"""What a structured output costs: tok/s with and without ``response_format`` (json_schema), and
the schema's compile time, first and cached.

One Decoda server (the embedded SmolLM2, float32); the two modes take turns within each round
(the order reversed every other round), at each concurrency, so drift over minutes hits both.
The schema asks for an object with a long required story (``minLength``), so a constrained
request generates about as many tokens as a free one; tokens/req shows what each produced.

    .venv/bin/python -m loadtests.bench_structured --concurrency 1,16 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
import uuid

import httpx

from loadtests.compare import local_decoda
from loadtests.loadgen import build_parser as loadgen_parser
from loadtests.loadgen import run_load

SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 40}, "story": {"type": "string", "minLength": 400}},
    "required": ["title", "story"],
    "additionalProperties": False,
}


def response_format(schema: dict) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "story", "schema": schema}}}


def compile_seconds(url: str) -> tuple[float, float]:
    """(sum, count) of the server's compile-time histogram: cache misses only."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    total = re.search(r"^decoda_structured_output_compile_seconds_sum (\S+)$", text, re.M)
    count = re.search(r"^decoda_structured_output_compile_seconds_count (\S+)$", text, re.M)
    return float(total.group(1)) if total else 0.0, float(count.group(1)) if count else 0.0


def request_seconds(url: str, schema: dict) -> float:
    """Wall time of one short request carrying ``schema``: a new schema's compile shows in it."""
    body = {"prompt": "Tell a story.", "max_tokens": 1, **response_format(schema)}
    start = time.perf_counter()
    httpx.post(f"{url}/v1/completions", json=body, timeout=120).raise_for_status()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests-per-client", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    flags = ["--max-num-seqs", str(max(levels)), "--max-model-len", "1024"]
    with local_decoda(flags) as (url, _):
        request_seconds(url, {"type": "object"})  # builds the grammar tokenizer once (~0.4 s), not measured
        before, _ = compile_seconds(url)
        fresh = {**SCHEMA, "title": f"bench-{uuid.uuid4().hex[:8]}"}  # a schema the cache has not seen
        first = request_seconds(url, fresh)
        compiled = compile_seconds(url)[0] - before
        cached = request_seconds(url, fresh)
        rows: dict[tuple[str, int], list[float]] = {}
        tokens: dict[tuple[str, int], list[float]] = {}
        modes = {"free": None, "json_schema": json.dumps(response_format(SCHEMA))}
        for round_ in range(args.rounds):
            order = list(modes.items()) if round_ % 2 == 0 else list(modes.items())[::-1]
            for concurrency in levels:
                for mode, extra in order:
                    load = loadgen_parser().parse_args(
                        ["--url", url, "--concurrency", str(concurrency), "--max-tokens", str(args.max_tokens),
                         "--requests", str(concurrency * args.requests_per_client)]
                        + (["--extra-body", extra] if extra else [])
                    )  # fmt: skip
                    summary = asyncio.run(run_load(load))
                    if summary["errors"]:
                        raise SystemExit(f"{mode} c={concurrency}: {summary['first_error']}")
                    rows.setdefault((mode, concurrency), []).append(summary["output_tok_s"])
                    tokens.setdefault((mode, concurrency), []).append(summary["tokens_per_request"])
                    print(f"round {round_ + 1} {mode} c={concurrency}: {summary['output_tok_s']:.1f} tok/s", flush=True)
    print(f"\nschema compile: {compiled * 1000:.1f} ms (server's histogram); first request {first * 1000:.0f} ms, "
          f"same schema again {cached * 1000:.0f} ms (1 token each)")  # fmt: skip
    print("\n| concurrency | free tok/s | json_schema tok/s | ratio (per round) | tokens/req free / json |")
    print("|---:|---:|---:|---:|---:|")
    for concurrency in levels:
        free, constrained = rows[("free", concurrency)], rows[("json_schema", concurrency)]
        ratios = [c / f for c, f in zip(constrained, free, strict=True)]
        print(f"| {concurrency} | {statistics.median(free):.1f} | {statistics.median(constrained):.1f} | "
              f"{statistics.median(ratios):.2f}x ({', '.join(f'{r:.2f}' for r in ratios)}) | "
              f"{statistics.median(tokens[('free', concurrency)]):.0f} / "
              f"{statistics.median(tokens[('json_schema', concurrency)]):.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
