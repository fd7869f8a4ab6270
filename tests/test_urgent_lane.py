"""The urgent lane (decoding/engine/urgent.py): a request that outranks every row of the step under way
stops the step's forward between two decoder layers, is prefilled to its first token in forwards of its
own, and the interrupted forward then runs again as it was planned. Every request's tokens stay those
of ``generate()`` (greedy) or of the same seeded request run alone (sampled).

The arrival mid-forward is made by a hook on the tiny model's second layer, which submits the request
while the first layer's K/V are already written. On the previous main nothing looked at new requests
during a forward: the high-priority request waited for the whole step (a quarter of a second and more
for 32 rows on a CPU) before its prompt was even admitted.
"""

from __future__ import annotations

import threading

import pytest
import torch

from decoding.engine.worker import Worker
from decoding.params import GenerationParams
from tests.engine_harness import EngineHarness, hf_greedy, tiny_llama
from tests.test_engine_priority import prompt  # the same random prompts

EOS = 2
LOW_GREEDY = GenerationParams(max_new_tokens=16, ignore_eos=True, priority=5)
LOW_SAMPLED = GenerationParams(max_new_tokens=16, ignore_eos=True, do_sample=True, temperature=1.3, top_k=50, seed=17,
                               priority=5)  # fmt: skip
HIGH = GenerationParams(max_new_tokens=6, ignore_eos=True, priority=0)


@pytest.fixture(scope="module")
def model(smollm2_tokenizer):
    return tiny_llama(len(smollm2_tokenizer), seed=5)


class ArrivesMidForward:
    """A pre-hook on decoder layer 1 that runs ``arrive`` once, during the forward of the ``at``-th step."""

    def __init__(self, harness: EngineHarness, arrive, at: int) -> None:  # noqa: ANN001
        self.arrive, self.at, self.forwards, self.done = arrive, at, 0, False
        layers = harness.engine.runner.layers
        layers[0].register_forward_pre_hook(self._count)
        layers[1].register_forward_pre_hook(self._maybe_arrive)

    def _count(self, module, args) -> None:  # noqa: ANN001
        self.forwards += 1

    def _maybe_arrive(self, module, args) -> None:  # noqa: ANN001
        if not self.done and self.forwards == self.at:
            self.done = True
            self.arrive()


def alone(model, tokenizer, request_id: str, prompt_ids: list[int], params: GenerationParams) -> list[int]:  # noqa: ANN001
    harness = EngineHarness(model, tokenizer, [EOS], max_num_seqs=4, max_model_len=256)
    harness.add(request_id, prompt_ids, params)
    harness.run()
    return harness.token_ids(request_id)


def test_an_outranking_request_gets_its_first_token_inside_the_step_under_way(model, smollm2_tokenizer):
    harness = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_seqs=8, max_model_len=256)
    engine = harness.engine
    harness.add("greedy", prompt(20, 1), LOW_GREEDY)
    harness.add("sampled", prompt(20, 2), LOW_SAMPLED)
    engine.urgent.take_commands = lambda: harness.add("high", prompt(12, 10), HIGH)  # the worker's inbox, handed over
    arrival = ArrivesMidForward(harness, lambda: engine.urgent.offer(HIGH.priority), at=4)
    with torch.inference_mode():
        for _ in range(3):  # the low prompts' step, then two decode steps
            engine.step()
        before = {rid: len(harness.token_ids(rid)) for rid in ("greedy", "sampled")}
        forwards_before = arrival.forwards
        engine.step()  # the high request arrives between the layers of this step's forward
    assert arrival.done
    assert len(harness.token_ids("high")) == 1  # its prompt ran inside the step, to its first token
    assert {rid: len(harness.token_ids(rid)) for rid in before} == {rid: n + 1 for rid, n in before.items()}
    # the interrupted forward, the high prompt's forward, the interrupted forward again from its first layer
    assert arrival.forwards - forwards_before == 3
    assert not engine.scheduler.preempted
    harness.run()
    assert harness.token_ids("greedy") == hf_greedy(model, prompt(20, 1), LOW_GREEDY.max_new_tokens)
    assert harness.token_ids("high") == hf_greedy(model, prompt(12, 10), HIGH.max_new_tokens)
    assert harness.token_ids("sampled") == alone(model, smollm2_tokenizer, "sampled", prompt(20, 2), LOW_SAMPLED)
    assert engine.pool.blocks.num_used == 0


def test_with_no_room_the_lane_preempts_nobody_and_the_request_waits_for_the_step(model, smollm2_tokenizer):
    harness = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_seqs=2, max_model_len=256)
    engine = harness.engine
    harness.add("greedy", prompt(20, 1), LOW_GREEDY)
    harness.add("sampled", prompt(20, 2), LOW_SAMPLED)
    engine.urgent.take_commands = lambda: harness.add("high", prompt(12, 10), HIGH)
    arrival = ArrivesMidForward(harness, lambda: engine.urgent.offer(HIGH.priority), at=3)
    with torch.inference_mode():
        for _ in range(3):
            engine.step()
    assert arrival.done and "high" not in harness.outputs  # both rows are taken: admitted at the next step
    assert not engine.scheduler.preempted and len(harness.token_ids("greedy")) == 3
    harness.run()  # the next step preempts a low request for it, as between steps
    assert harness.token_ids("high") == hf_greedy(model, prompt(12, 10), HIGH.max_new_tokens)
    assert harness.token_ids("greedy") == hf_greedy(model, prompt(20, 1), LOW_GREEDY.max_new_tokens)
    assert harness.token_ids("sampled") == alone(model, smollm2_tokenizer, "sampled", prompt(20, 2), LOW_SAMPLED)


def test_requests_of_one_priority_never_hook_a_forward(model, smollm2_tokenizer):
    harness = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_seqs=8, max_model_len=256)
    harness.add("a", prompt(20, 1), GenerationParams(max_new_tokens=4, ignore_eos=True))
    with torch.inference_mode():
        harness.engine.step()
        assert not harness.engine.urgent.in_use
        assert all(not layer._forward_pre_hooks for layer in harness.engine.runner.layers)
        harness.engine.urgent.offer(-3)  # nothing is armed: no forward is stopped
    harness.run()
    assert harness.token_ids("a") == hf_greedy(model, prompt(20, 1), 4)


def test_through_the_worker_an_abort_sent_mid_step_waits_for_the_step_to_end(model, smollm2_tokenizer):
    """The worker thread: a submit and an abort arrive while a forward runs; the submit is served by the
    lane inside the step, the abort only after the step (it must not free rows the forward still feeds)."""
    harness = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_seqs=8, max_model_len=256)
    outputs: dict[str, list] = {}
    finished = {rid: threading.Event() for rid in ("greedy", "sampled", "high")}

    def sink(output) -> None:  # noqa: ANN001
        outputs.setdefault(output.request_id, []).append(output)
        if output.finished:
            finished[output.request_id].set()

    worker, _ = Worker.spawn(lambda: (harness.engine, None))
    low_sampled = LOW_SAMPLED.replace(max_new_tokens=200)

    def arrive() -> None:
        worker.submit("high", prompt(12, 10), HIGH, sink)
        worker.abort("sampled")

    arrival = ArrivesMidForward(harness, arrive, at=5)
    try:
        worker.submit("greedy", prompt(20, 1), LOW_GREEDY, sink)
        worker.submit("sampled", prompt(20, 2), low_sampled, sink)
        for event in finished.values():
            assert event.wait(60)
    finally:
        worker.stop(10)
    assert arrival.done
    tokens = {rid: [t for out in outs for d in out.deltas for t in d.token_ids] for rid, outs in outputs.items()}
    assert tokens["high"] == hf_greedy(model, prompt(12, 10), HIGH.max_new_tokens)
    assert tokens["greedy"] == hf_greedy(model, prompt(20, 1), LOW_GREEDY.max_new_tokens)
    assert outputs["sampled"][-1].error is None and 0 < len(tokens["sampled"]) < 200
    assert harness.engine.pool.blocks.num_used == 0
