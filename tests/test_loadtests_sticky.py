"""The sticky-routing benchmark's parts that need no server: the replicas' cache size and how it is reported."""

from __future__ import annotations

import argparse

import pytest

from loadtests import bench_sticky


def test_the_cache_size_is_read_from_the_replicas_ready_line(tmp_path):
    log = tmp_path / "replica-0.log"
    log.write_text(
        "INFO decoding.engine.launch: engine ready: model=smollm2-135m-instruct max_model_len=2048 max_num_seqs=64 "
        "kv_cache=381 MiB (542 blocks of 16, prefix caching on, paged attention native)\n"
    )
    assert bench_sticky.cache_tokens(log) == 542 * 16
    log.write_text("INFO uvicorn.error: Started server process\n")
    with pytest.raises(SystemExit, match="engine ready"):
        bench_sticky.cache_tokens(log)


def test_the_report_says_how_many_conversations_each_replica_holds():
    args = argparse.Namespace(clients=8, conversations=1, max_tokens=32, document_words=600, kv_cache_memory="345MB",
                              rounds=1)  # fmt: skip
    mode = {"hit_rate": 0.9, "reused": 0.95, "ttft_p50": 0.5, "ttft_p95": 0.7, "first_ttft_p50": 9.0,
            "prompt_mean": 1400, "last_prompt_mean": 1468, "turns": 24, "errors": 0, "seconds": 60,
            "first_replicas": "5/3"}  # fmt: skip
    rounds = [{bench_sticky.STICKY: mode, bench_sticky.ROUND_ROBIN: {**mode, "ttft_p50": 1.0}}]
    text = bench_sticky.report(rounds, args, "0.1 0.2 0.3", 7500)
    assert "(--kv-cache-memory 345MB): 7500 positions, about 5.0 conversations at their last turn (1500" in text
    assert "within each round: 0.50x" in text and "| 1 | sticky | 5/3 | 90.0% |" in text
    assert text.rstrip().endswith("--kv-cache-memory 345MB`")


def test_the_split_counts_each_conversations_first_turn_by_the_replica_nginx_logged(tmp_path):
    keys = [f"{n:032x}" for n in range(4)]
    log = tmp_path / "access.log"
    lines = [(keys[0], 1, "127.0.0.1:9001"), (keys[0], 2, "127.0.0.1:9002"), (keys[1], 1, "127.0.0.1:9001"),
             (keys[2], 1, "127.0.0.1:9001"), (keys[3], 1, "127.0.0.1:9002")]  # fmt: skip
    log.write_text("".join(f'127.0.0.1 "POST /v1/chat/completions HTTP/1.1" 200 512 0.4 s upstream={upstream} '
                           f"request_id={key}-{turn}\n" for key, turn, upstream in lines))  # fmt: skip
    assert bench_sticky.first_replicas(log, keys) == "3/1"
    assert bench_sticky.first_replicas(log, keys[:1]) == "1/0"
