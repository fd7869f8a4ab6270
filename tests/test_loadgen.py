"""The load generator's accounting, against a real uvicorn serving the fake engine."""

from __future__ import annotations

import asyncio

from loadtests.loadgen import RequestResult, build_parser, percentile, prompt_for, run_load, summarize
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


def test_a_long_prompt_gets_a_head_of_its_own_per_request_and_run():
    text = "tools and a question " * 50
    first, second, later_run = prompt_for(0, text, 7), prompt_for(1, text, 7), prompt_for(0, text, 8)
    assert first.endswith(text) and second.endswith(text)
    assert len({first, second, later_run}) == 3 and first[:12] != second[:12]  # they differ at the start
    assert prompt_for(3, None, 7) == prompt_for(11, None, 9)  # the short prompts, in turn


def test_compare_states_the_issue_52_goals_against_llama_cpp():
    from loadtests.compare import LLAMACPP, decoda_name, goal_lines, prompt_lines

    gguf = decoda_name("gguf")
    rows = []
    for round_, (one, eight, llama) in enumerate([(20.0, 90.0, 18.0), (22.0, 80.0, 20.0)], start=1):
        rows += [
            _row(gguf, 1, round_, one) | {"resident_mb": 1500.0},
            _row(gguf, 8, round_, eight),
            _row(LLAMACPP, 1, round_, llama) | {"resident_mb": 1200.0},
            _row(LLAMACPP, 8, round_, llama),
        ]
    goals = "\n".join(goal_lines(rows))
    assert "Decoda gguf vs llama.cpp's server at concurrency 1: **1.11x**" in goals  # (1.11, 1.10)
    assert "Decoda gguf vs llama.cpp's server at concurrency 8: **4.50x**" in goals  # (5.0, 4.0)
    assert "over llama.cpp's server at concurrency 1: **1.25x**" in goals  # resident memory
    prompts = [
        {"server": gguf, "concurrency": 1, "round": 1, "ttft_p50": 0.9, "prompt": "tool_prompt.txt"},
        {"server": LLAMACPP, "concurrency": 1, "round": 1, "ttft_p50": 1.2, "prompt": "tool_prompt.txt"},
    ]
    text = "\n".join(prompt_lines(prompts))
    assert "`tool_prompt.txt`" in text and "p50 **900 ms**" in text and "**0.75x**" in text
