"""Continuous batching: seeded requests, failures and timeouts stay with their own request."""

from __future__ import annotations

import random

import pytest
import torch

from decoding.engine.limits import EngineLimits
from decoding.params import GenerationParams
from tests.engine_harness import EngineHarness, tiny_llama

EOS = 2


@pytest.fixture(scope="module")
def model(smollm2_tokenizer):
    return tiny_llama(len(smollm2_tokenizer), seed=4)


def prompt(seed: int, length: int = 20) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 49152) for _ in range(length)]


SEEDED = GenerationParams(max_new_tokens=24, do_sample=True, temperature=0.9, top_p=0.95, seed=1234)


def test_seeded_request_is_the_same_alone_and_in_a_crowd(model, smollm2_tokenizer):
    alone = EngineHarness(model, smollm2_tokenizer, [EOS])
    alone.add("seeded", prompt(0), SEEDED)
    alone.run()

    crowd = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_batched_tokens=16)
    for i in range(6):
        knobs = {"do_sample": True, "seed": i} if i % 2 else {}
        crowd.add(f"other{i}", prompt(100 + i, 5 + 7 * i), GenerationParams(max_new_tokens=10 + i, **knobs))
    crowd.add("seeded", prompt(0), SEEDED)
    crowd.add("late", prompt(200), GenerationParams(max_new_tokens=30, do_sample=True))
    crowd.run()
    assert crowd.token_ids("seeded") == alone.token_ids("seeded")
    assert len(alone.token_ids("seeded")) > 0


def test_a_request_that_raises_fails_alone(model, smollm2_tokenizer, monkeypatch):
    harness = EngineHarness(model, smollm2_tokenizer, [EOS])
    for i in range(3):
        harness.add(f"r{i}", prompt(i), GenerationParams(max_new_tokens=8, ignore_eos=True))
    broken = harness.engine.requests["r1"].rows[0].sampling

    def explode(token: int) -> None:
        raise RuntimeError("injected failure")

    monkeypatch.setattr(broken, "append", explode)
    harness.run()
    assert harness.outputs["r1"][-1].error and "r1" in harness.outputs["r1"][-1].error
    for ok in ("r0", "r2"):
        assert len(harness.token_ids(ok)) == 8 and harness.outputs[ok][-1].error is None
    assert harness.engine.pool.num_free == harness.engine.pool.num_slots


@pytest.mark.parametrize("alone", [True, False])
def test_knobs_that_overflow_the_scores_fail_their_request_as_invalid_and_spare_the_rest(
    model, smollm2_tokenizer, alone, caplog
):
    """A repetition_penalty of 5e-324 divides the scores into inf (found by schemathesis): that
    request fails at once with code invalid_request (HTTP 400), alone or in a batch, once (this
    used to recurse until Python's recursion limit, logging a traceback at every level)."""
    harness = EngineHarness(model, smollm2_tokenizer, [EOS])
    tiny = GenerationParams(max_new_tokens=6, do_sample=True, repetition_penalty=5e-324, seed=1)
    harness.add("overflow", prompt(1), tiny)
    if not alone:
        harness.add("fine", prompt(2), GenerationParams(max_new_tokens=6, do_sample=True, seed=2, ignore_eos=True))
    harness.run()
    (last,) = [o for o in harness.outputs["overflow"] if o.finished]
    assert last.error_code == "invalid_request" and "no token can be picked" in last.error
    assert len([r for r in caplog.records if "failed while sampling" in r.getMessage()]) == 1
    if not alone:
        assert len(harness.token_ids("fine")) == 6 and harness.outputs["fine"][-1].error is None
    assert harness.engine.pool.num_free == harness.engine.pool.num_slots


def test_a_broken_batched_forward_is_retried_request_by_request(model, smollm2_tokenizer, monkeypatch):
    harness = EngineHarness(model, smollm2_tokenizer, [EOS])
    harness.add("good", prompt(1), GenerationParams(max_new_tokens=6, ignore_eos=True))
    harness.add("bad", prompt(2), GenerationParams(max_new_tokens=6, ignore_eos=True))
    runner = harness.engine.runner
    real_forward = runner.forward
    bad_slot = harness.engine.requests["bad"].rows[0]

    def forward(inputs):  # noqa: ANN001, ANN202
        if any(i.slot == bad_slot.slot for i in inputs):
            raise RuntimeError("poisoned row")
        return real_forward(inputs)

    monkeypatch.setattr(runner, "forward", forward)
    harness.run()
    assert harness.outputs["bad"][-1].error
    assert len(harness.token_ids("good")) == 6


def test_request_timeout_and_max_time(model, smollm2_tokenizer):
    """Both limits end a request as HF's MaxTimeCriteria does: finish_reason "length", no error,
    with what it generated so far (lifecycle fault 1: the server timeout was a 500)."""
    harness = EngineHarness(model, smollm2_tokenizer, [EOS])
    harness.engine.limits = EngineLimits(256, 16, 512, request_timeout=0.0)
    harness.add("late", prompt(3), GenerationParams(max_new_tokens=5))
    harness.add("late-beams", prompt(3), GenerationParams(max_new_tokens=5, num_beams=4, num_beam_groups=2))
    harness.run()
    for name in ("late", "late-beams"):  # expired before a single step: nothing generated, no error
        assert harness.outputs[name][-1].error is None
        assert harness.finish_reason(name) == "length"

    harness = EngineHarness(model, smollm2_tokenizer, [EOS])
    names = ("plain", "beam", "contrastive")
    for name, params in zip(
        names,
        (
            GenerationParams(max_new_tokens=200, ignore_eos=True),
            GenerationParams(max_new_tokens=200, ignore_eos=True, num_beams=2),
            GenerationParams(max_new_tokens=200, ignore_eos=True, penalty_alpha=0.6, top_k=4),
        ),
        strict=True,
    ):
        harness.add(name, prompt(5), params)
    with torch.inference_mode():
        for _ in range(5):
            harness.engine.step()
    for name in names:  # the server timeout passes mid-generation (set on the request: no clock race)
        harness.engine.requests[name].timeout = 0.0
    harness.run()
    for name in names:
        assert harness.outputs[name][-1].error is None, name
        assert harness.finish_reason(name) == "length", name
        assert 0 < len(harness.token_ids(name)) < 200, name
    assert harness.engine.pool.num_free == harness.engine.pool.num_slots

    harness = EngineHarness(model, smollm2_tokenizer, [EOS])
    harness.add("slow", prompt(4), GenerationParams(max_new_tokens=200, ignore_eos=True, max_time=0.05))
    with torch.inference_mode():
        harness.run()
    assert harness.finish_reason("slow") == "length"
    assert len(harness.token_ids("slow")) < 200
