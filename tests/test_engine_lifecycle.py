"""Engine-side lifecycle faults of the engine-shape issue, each pinned by a test.

- rows with different ``assistant_early_exit`` in one batch draft at their own depth;
- rows that feed many tokens a step (contrastive candidates) never starve an admitted prompt;
- a list of requests cancelled at once frees every row within one step.
"""

from __future__ import annotations

import random

import pytest
import torch

from decoding.params import GenerationParams
from tests.engine_harness import EngineHarness, hf_greedy, tiny_llama

EOS = 2
VOCAB = 64


@pytest.fixture(scope="module")
def model():
    return tiny_llama(VOCAB, seed=3, num_layers=4)


def prompt(seed: int, length: int = 12) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(length)]


def test_each_row_drafts_at_its_own_early_exit_depth(model, smollm2_tokenizer, monkeypatch):
    harness = EngineHarness(model, smollm2_tokenizer, [EOS])
    runner = harness.engine.runner
    real_forward = runner.forward
    depths: list[int] = []

    def forward(inputs, num_layers=None):  # noqa: ANN001, ANN202
        if num_layers is not None:
            depths.append(num_layers)
        return real_forward(inputs, num_layers=num_layers)

    monkeypatch.setattr(runner, "forward", forward)
    for depth in (1, 3):
        params = GenerationParams(max_new_tokens=12, assistant_early_exit=depth)
        harness.add(f"exit{depth}", prompt(depth), params)
    harness.run()
    assert set(depths) == {1, 3}  # before: the first row's depth drafted for both
    for depth in (1, 3):  # speculation never changes the target's greedy output
        assert harness.token_ids(f"exit{depth}") == hf_greedy(model, prompt(depth), 12)


def test_wide_rows_never_starve_an_admitted_prompt(model, smollm2_tokenizer):
    """16 contrastive rows with top_k 32 feed 512 tokens a step, the whole default budget."""
    harness = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_seqs=17, max_num_batched_tokens=512)
    wide = GenerationParams(max_new_tokens=40, ignore_eos=True, penalty_alpha=0.6, top_k=32)
    for i in range(16):
        harness.add(f"wide{i}", prompt(i), wide)
    with torch.inference_mode():
        for _ in range(3):  # every wide row is decoding
            harness.engine.step()
        harness.add("late", prompt(99, length=200), GenerationParams(max_new_tokens=4, ignore_eos=True))
        steps = 0
        while "late" not in harness.outputs:
            harness.engine.step()
            steps += 1
            assert steps <= 4, "the late prompt made no progress while the wide rows decode"
    assert all(not harness.engine.requests[f"wide{i}"].finished for i in range(16))
    harness.run()
    assert len(harness.token_ids("late")) == 4


def test_aborting_many_requests_frees_every_row_at_once(model, smollm2_tokenizer):
    harness = EngineHarness(model, smollm2_tokenizer, [EOS])
    for i in range(3):
        harness.add(f"list-{i}", prompt(i), GenerationParams(max_new_tokens=50, ignore_eos=True, n=2))
    harness.add("beams", prompt(7), GenerationParams(max_new_tokens=50, ignore_eos=True, num_beams=3))
    with torch.inference_mode():
        for _ in range(3):
            harness.engine.step()
    assert harness.engine.pool.num_free == harness.engine.pool.num_slots - 9
    for request_id in ("list-0", "list-1", "list-2", "beams"):
        harness.engine.abort(request_id)
    assert harness.engine.pool.num_free == harness.engine.pool.num_slots
    assert not harness.engine.has_work()


def test_a_compiled_forward_gets_its_layout_beside_the_call(model, smollm2_tokenizer):
    """Eager forwards take the step layout as an attention kwarg; a compiled one cannot take a
    Python object per step, so the runner hands it over through ``active_layout`` instead."""
    harness = EngineHarness(model, smollm2_tokenizer, [EOS])
    served = harness.engine.runner.model
    served.forward = torch.compile(served.forward, backend="eager", dynamic=True)
    harness.engine.runner.compiled = True
    harness.add("r", prompt(5), GenerationParams(max_new_tokens=6))
    harness.run()
    assert harness.token_ids("r") == hf_greedy(model, prompt(5), 6)


def test_gauges_follow_an_abort_with_no_step_after_it(model, smollm2_tokenizer):
    """An aborted request frees its rows between steps; if the engine then goes idle, no step runs
    to refresh the gauges, so the abort itself must (an autoscaler reads them)."""
    from decoding.telemetry import EngineObserver

    class Gauges(EngineObserver):
        def on_step(self, num_rows: int, num_running: int, num_waiting: int, kv_usage: float) -> None:
            self.last = (num_running, num_waiting, kv_usage)

    harness = EngineHarness(model, smollm2_tokenizer, [EOS])
    gauges = harness.engine.ctx.observer = Gauges()
    for i in range(4):
        harness.add(f"r{i}", prompt(i), GenerationParams(max_new_tokens=50, ignore_eos=True))
    with torch.inference_mode():
        harness.engine.step()
    assert gauges.last[0] == 4 and gauges.last[2] > 0
    for i in range(4):
        harness.engine.abort(f"r{i}")
    assert gauges.last == (0, 0, 0.0)
