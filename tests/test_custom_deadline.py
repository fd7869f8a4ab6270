"""A custom method that never stops (no model call, no criteria check) is interrupted at its deadline,
the other requests resume, and /health says when even that cannot stop it."""

from __future__ import annotations

import threading
import time

import pytest

from decoding.custom.deadline import DeadlineExceeded, Watchdog
from decoding.params import GenerationParams
from tests.engine_harness import hf_greedy
from tests.fake_engine import FakeEngineClient
from tests.test_api import client_for, run
from tests.test_custom_generate import EOS, harness_with, tiny, write_method  # noqa: F401 (tiny is a fixture)

SPINNER = """
def generate(model, input_ids, generation_config=None, streamer=None, **kwargs):
    '''Never calls the model again and swallows every Exception: only the watchdog can stop it.'''
    streamer.put(input_ids)
    while True:
        try:
            pass
        except Exception:
            pass
"""


def _in_thread(work) -> dict:  # noqa: ANN001
    """Run ``work`` on another thread (the worker is never the main thread) and report how it ended."""
    outcome: dict = {}

    def body() -> None:
        try:
            work()
            outcome["ended"] = "returned"
        except DeadlineExceeded:
            outcome["ended"] = "interrupted"

    thread = threading.Thread(target=body)
    thread.start()
    outcome["thread"] = thread
    return outcome


def test_a_python_loop_is_interrupted_past_its_deadline_even_if_it_catches_exception():
    watchdog = Watchdog(grace=0.1, stuck_after=5)

    def spin() -> None:
        with watchdog.watch("spinner", time.monotonic() + 0.2):
            while True:
                try:
                    pass
                except Exception:  # noqa: S110
                    pass

    outcome = _in_thread(spin)
    outcome["thread"].join(5)
    assert outcome["ended"] == "interrupted" and watchdog.stuck is None


def test_a_job_inside_one_long_c_call_is_reported_stuck_until_it_returns():
    watchdog = Watchdog(grace=0.05, stuck_after=0.3)

    def sleep() -> None:
        with watchdog.watch("custom_generate 'sleepy' (request r1)", time.monotonic() + 0.05):
            time.sleep(1.5)  # one C call: the interruption waits for it

    outcome = _in_thread(sleep)
    time.sleep(0.9)
    assert watchdog.stuck is not None and "custom_generate 'sleepy' (request r1)" in watchdog.stuck
    outcome["thread"].join(5)
    assert outcome["ended"] == "interrupted" and watchdog.stuck is None


def test_a_job_that_finishes_in_time_is_never_interrupted():
    watchdog = Watchdog(grace=0.05, stuck_after=0.1)
    for _ in range(3):
        with watchdog.watch("quick", time.monotonic() + 0.05):
            pass
    time.sleep(0.3)  # past every deadline: nothing may land now
    assert watchdog.stuck is None


def test_the_engine_interrupts_a_spinning_method_and_the_batch_resumes(tiny, smollm2_tokenizer, tmp_path):  # noqa: F811
    path = write_method(tmp_path / "spinner", SPINNER)
    harness = harness_with(tiny, smollm2_tokenizer, [EOS], specs=[("spinner", str(path))])
    harness.engine.custom.watchdog.grace = 0.1
    harness.add("plain", [5, 6, 7], GenerationParams(max_new_tokens=6))
    harness.add("spin", [5, 6, 7], GenerationParams(max_new_tokens=100, max_time=0.3, custom_generate="spinner"))
    started = time.monotonic()
    harness.run()
    assert time.monotonic() - started < 10
    last = harness.outputs["spin"][-1]
    assert last.finished and last.error_code == "internal" and "deadline" in last.error
    assert harness.token_ids("plain") == hf_greedy(tiny, [5, 6, 7], 6)


class _StuckEngine(FakeEngineClient):
    def stuck(self) -> str | None:
        return "custom_generate 'x' (request r) has run 6 s past its deadline and does not stop"


@pytest.mark.parametrize("engine", [_StuckEngine()])
def test_health_is_red_with_the_reason_while_the_worker_is_blocked(engine):
    async def go():  # noqa: ANN202
        async with client_for(engine) as http:
            return await http.get("/health")

    r = run(go())
    assert r.status_code == 503 and r.json()["status"] == "worker blocked"
    assert "custom_generate 'x'" in r.json()["reason"]
