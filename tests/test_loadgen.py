"""The load generator's accounting, against a real uvicorn serving the fake engine."""

from __future__ import annotations

import asyncio

from loadtests.loadgen import RequestResult, build_parser, percentile, run_load, summarize
from server.app import create_app
from server.config.settings import Settings
from tests.fake_engine import FakeEngineClient
from tests.threaded_server import uvicorn_in_thread


def test_percentile_interpolates():
    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert abs(percentile(list(range(101)), 95) - 95.0) < 1e-9


def test_summarize_counts_only_successes():
    results = [RequestResult(ttft=0.1, itls=[0.01, 0.03], e2e=1.0, output_tokens=10), RequestResult(error="boom")]
    summary = summarize(results, wall=2.0, concurrency=2)
    assert summary["errors"] == 1 and summary["output_tokens"] == 10 and summary["output_tok_s"] == 5.0
    assert abs(summary["itl_p50"] - 0.02) < 1e-12 and summary["first_error"] == "boom"


def test_against_a_real_server():
    with uvicorn_in_thread(create_app(Settings(), FakeEngineClient(delay=0.01))) as base:
        args = build_parser().parse_args(
            ["--url", base, "--concurrency", "3", "--requests", "6", "--max-tokens", "5", "--ban-tokens", ""]
        )
        summary = asyncio.run(run_load(args))
    assert summary["errors"] == 0, summary["first_error"]
    assert summary["requests"] == 6 and summary["output_tokens"] == 30
    assert summary["ttft_p50"] >= 0.01 and summary["itl_p50"] >= 0.005


def _row(server: str, concurrency: int, round_: int, tok_s: float) -> dict:
    return {"server": server, "concurrency": concurrency, "round": round_, "output_tok_s": tok_s,
            "errors": 0, "requests": 3}  # fmt: skip


def test_compare_takes_medians_and_ratios_within_rounds():
    from loadtests.compare import DECODA, TRANSFORMERS, goal_lines, round_ratios, summarize_rounds

    rows = [
        _row(DECODA, 1, 1, 20.0), _row(DECODA, 16, 1, 200.0), _row(TRANSFORMERS, 16, 1, 100.0),
        _row(DECODA, 1, 2, 10.0), _row(DECODA, 16, 2, 150.0), _row(TRANSFORMERS, 16, 2, 50.0),
        _row(DECODA, 1, 3, 30.0), _row(DECODA, 16, 3, 180.0),  # transformers missing in round 3
    ]  # fmt: skip
    assert round_ratios(rows, (DECODA, 16), (TRANSFORMERS, 16)) == [2.0, 3.0]
    assert round_ratios(rows, (DECODA, 16), (DECODA, 1)) == [10.0, 15.0, 6.0]
    lines = {(r["server"], r["concurrency"]): r for r in summarize_rounds(rows)}
    decoda16 = lines[(DECODA, 16)]
    assert decoda16["output_tok_s"] == 180.0 and decoda16["rounds_tok_s"] == [200.0, 150.0, 180.0]
    assert decoda16["round"] == 3 and decoda16["requests"] == 9  # latencies come from the median round
    assert lines[(TRANSFORMERS, 16)]["output_tok_s"] == 75.0
    goals = goal_lines(rows)
    assert "**10.00x**" in goals[0] and "**2.50x**" in goals[1]
