"""Priorities in the engine: a request of higher priority (lower number) preempts lower ones when rows
or KV blocks are short, and the requests that gave way resume token for token: a seeded sampled
request and a greedy one produce exactly what they produce when nothing preempts them. While a
higher-priority prompt is prefilled, the lower-priority rows sit that step out (its first token comes
after a step of its own), then go on where they were.

On the previous main a priority did not exist; the high-priority request waited behind the running
ones (first come first served) and nothing was preempted for it.
"""

from __future__ import annotations

import random

import pytest
import torch

from decoding.params import GenerationParams
from tests.engine_harness import EngineHarness, tiny_llama

EOS = 2
VOCAB = 49152
LOW_GREEDY = GenerationParams(max_new_tokens=24, ignore_eos=True, priority=5, caller="key:batch")
LOW_SAMPLED = GenerationParams(max_new_tokens=24, ignore_eos=True, do_sample=True, temperature=1.3, top_k=50, seed=17,
                               priority=5, caller="key:batch")  # fmt: skip
HIGH = GenerationParams(max_new_tokens=6, ignore_eos=True, priority=0, caller="key:interactive")


@pytest.fixture(scope="module")
def model(smollm2_tokenizer):
    return tiny_llama(len(smollm2_tokenizer), seed=5)


def prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(length)]


# short of rows: two rows for four requests; short of blocks: 24 blocks of 16 tokens, two 150-token
# prompts holding 20 of them when a 220-token one of higher priority (14 blocks and the reserve) arrives
SHORT = {
    "rows": dict(max_num_seqs=2, low_prompt=20, high_prompt=12, highs=2),
    "blocks": dict(max_num_seqs=4, kv_cache_blocks=24, low_prompt=150, high_prompt=220, highs=1),
}


def run_with_highs_arriving_late(harness: EngineHarness, low_prompt: int, high_prompt: int, highs: int) -> list[str]:
    """Two low-priority requests decode for a few steps, then ``highs`` high-priority ones arrive;
    returns which requests were preempted in the step that admitted them."""
    harness.add("greedy", prompt(low_prompt, 1), LOW_GREEDY)
    harness.add("sampled", prompt(low_prompt, 2), LOW_SAMPLED)
    with torch.inference_mode():
        for _ in range(6):
            harness.engine.step()
        for i in range(highs):
            harness.add(f"high{i}", prompt(high_prompt, 10 + i), HIGH)
        harness.engine.step()
    preempted = sorted(s.request.request_id for s in harness.engine.scheduler.preempted)
    harness.run()
    return preempted


@pytest.mark.parametrize("short", sorted(SHORT))
def test_a_higher_priority_request_preempts_and_the_preempted_resume_token_exact(model, smollm2_tokenizer, short):
    setting = dict(SHORT[short])
    pool = {k: setting.pop(k) for k in ("max_num_seqs", "kv_cache_blocks") if k in setting}
    tight = EngineHarness(model, smollm2_tokenizer, [EOS], max_model_len=256, **pool)
    roomy = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_seqs=8, max_model_len=256)
    assert run_with_highs_arriving_late(tight, **setting) == ["greedy", "sampled"]
    assert run_with_highs_arriving_late(roomy, **setting) == []
    for request_id in ("greedy", "sampled", *(f"high{i}" for i in range(setting["highs"]))):
        assert tight.outputs[request_id][-1].error is None, request_id
        assert tight.token_ids(request_id) == roomy.token_ids(request_id), request_id
    assert len(tight.token_ids("sampled")) == 24 and len(tight.token_ids("high0")) == 6
    assert tight.engine.pool.blocks.num_used == 0 and not tight.engine.scheduler.preempted


def test_the_high_priority_request_finishes_while_the_low_ones_wait(model, smollm2_tokenizer):
    harness = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_seqs=2, max_model_len=256)
    harness.add("greedy", prompt(20, 1), LOW_GREEDY)
    harness.add("sampled", prompt(20, 2), LOW_SAMPLED)
    with torch.inference_mode():
        for _ in range(3):
            harness.engine.step()
        harness.add("high0", prompt(12, 10), HIGH)
        steps = 0
        while not (harness.outputs.get("high0") and harness.outputs["high0"][-1].finished):
            harness.engine.step()
            steps += 1
    assert steps == HIGH.max_new_tokens  # one prefill step that gives its first token, then one per token
    assert len(harness.token_ids("greedy")) < LOW_GREEDY.max_new_tokens
    assert len(harness.token_ids("sampled")) < LOW_SAMPLED.max_new_tokens


def test_lower_priority_rows_sit_out_the_step_that_prefills_a_higher_priority_prompt(model, smollm2_tokenizer):
    harness = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_seqs=8, max_model_len=256)
    harness.add("greedy", prompt(20, 1), LOW_GREEDY)
    harness.add("sampled", prompt(20, 2), LOW_SAMPLED)
    with torch.inference_mode():
        for _ in range(3):
            harness.engine.step()
        before = {rid: len(harness.token_ids(rid)) for rid in ("greedy", "sampled")}
        harness.add("high0", prompt(12, 10), HIGH)
        harness.engine.step()  # the high prompt's step: its first token, nobody else's
        assert len(harness.token_ids("high0")) == 1
        assert {rid: len(harness.token_ids(rid)) for rid in before} == before
        harness.engine.step()  # then everyone decodes together again
        assert {rid: len(harness.token_ids(rid)) for rid in before} == {rid: n + 1 for rid, n in before.items()}
    assert not harness.engine.scheduler.preempted
