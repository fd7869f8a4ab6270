"""Preemption always resumes: rows that share blocks (n > 1) keep sharing while swapped out, a request
that can never fit again fails with its id instead of ending as a truncated success, and the rest go on.

The issue's reproduction (``--kv-cache-memory 64MB --max-model-len 1024`` on SmolLM2-135M: a request
with n=8 running, a second with a 700-token prompt and n=8 preempted, a third small one) is scaled
down here to the tiny random model: a 48-block pool of 16-token blocks, a 170-token prompt. Before
the fix the preempted request was copied out row by row (8 x 11 prompt blocks, more than the whole
pool), so it could never resume and nothing queued behind it was ever admitted.
"""

from __future__ import annotations

import random

import pytest
import torch

from decoding.engine.limits import EngineLimits, kv_pool_for
from decoding.params import GenerationParams
from tests.engine_harness import EngineHarness, tiny_llama

EOS = 2
VOCAB = 49152
POOL = dict(max_num_seqs=20, max_model_len=256, kv_cache_blocks=48)  # 16-token blocks


@pytest.fixture(scope="module")
def model(smollm2_tokenizer):
    return tiny_llama(len(smollm2_tokenizer), seed=7)


def prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(length)]


RUNNING = GenerationParams(max_new_tokens=56, n=8, do_sample=True, seed=11, ignore_eos=True)
LONG = GenerationParams(max_new_tokens=24, n=8, do_sample=True, seed=12, ignore_eos=True)
SMALL = GenerationParams(max_new_tokens=8, ignore_eos=True)


def run_until_preempted(harness: EngineHarness, max_steps: int = 500) -> None:
    with torch.inference_mode():
        for _ in range(max_steps):
            if harness.engine.scheduler.preempted:
                return
            harness.engine.step()
    raise AssertionError("nothing was preempted")


def all_choices(harness: EngineHarness, request_id: str, n: int) -> list[list[int]]:
    return [harness.token_ids(request_id, index) for index in range(n)]


def test_a_preempted_n8_request_resumes_and_the_queue_behind_it_is_served(model, smollm2_tokenizer):
    roomy = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_seqs=20, max_model_len=256)
    tight = EngineHarness(model, smollm2_tokenizer, [EOS], **POOL)
    for harness in (roomy, tight):
        harness.add("running", prompt(8, seed=1), RUNNING)
        harness.add("long", prompt(170, seed=2), LONG)
    run_until_preempted(tight)
    held = tight.engine.scheduler.swapped_blocks(tight.engine.strategies["long"])
    assert held <= 10 + 2 * 8  # its shared prompt blocks once, and at most two blocks of its own per row
    for harness in (roomy, tight):
        harness.add("small", prompt(12, seed=3), SMALL)
        harness.run()
    for request_id, n in (("running", 8), ("long", 8), ("small", 1)):
        assert all_choices(tight, request_id, n) == all_choices(roomy, request_id, n), request_id
        assert tight.outputs[request_id][-1].error is None
        assert all(tight.finish_reason(request_id, index) == "length" for index in range(n))
    assert len(tight.token_ids("small")) == SMALL.max_new_tokens
    assert tight.engine.pool.blocks.num_used == 0 and not tight.engine.scheduler.preempted


def test_a_request_that_cannot_fit_even_alone_fails_with_its_id_and_the_others_go_on(model, smollm2_tokenizer):
    harness = EngineHarness(model, smollm2_tokenizer, [EOS], **POOL)
    # 8 rows of 200 tokens each need 8 * 13 blocks once they part: more than the whole pool
    harness.add("huge", prompt(100, seed=4), GenerationParams(max_new_tokens=100, n=8, do_sample=True, seed=1))
    harness.add("small", prompt(12, seed=3), SMALL)
    harness.run()
    last = harness.outputs["huge"][-1]
    assert last.finished and last.error is not None and "huge" in last.error and "kv-cache-memory" in last.error
    assert harness.outputs["small"][-1].error is None and len(harness.token_ids("small")) == 8
    assert harness.engine.pool.blocks.num_used == 0


def test_a_request_the_pool_can_never_admit_fails_at_once_and_the_queue_moves_on(model, smollm2_tokenizer):
    harness = EngineHarness(model, smollm2_tokenizer, [EOS], **POOL)
    # more rows than the batch has: the server's validation refuses it, the engine must not wait on it forever
    harness.add("wide", prompt(12, seed=5), GenerationParams(max_new_tokens=4, n=21, do_sample=True, seed=2))
    harness.add("small", prompt(12, seed=3), SMALL)
    with torch.inference_mode():
        harness.engine.step()
    last = harness.outputs["wide"][-1]
    assert last.finished and "request wide failed" in last.error and "21 rows" in last.error
    harness.run()
    assert harness.outputs["small"][-1].error is None and len(harness.token_ids("small")) == 8


def test_the_start_up_check_counts_a_row_per_sequence_not_one_row(model):
    # one max-length request (18 blocks with the contrastive scratch) fits 30 blocks, but admitting
    # one with 16 rows and a 256-token prompt takes 16 + 16
    limits = EngineLimits(max_model_len=256, max_num_seqs=16, max_num_batched_tokens=512, kv_cache_blocks=30)
    with pytest.raises(ValueError, match="max-num-seqs"):
        kv_pool_for(model, limits, torch.device("cpu"))
    roomier = EngineLimits(max_model_len=256, max_num_seqs=16, max_num_batched_tokens=512, kv_cache_blocks=32)
    assert kv_pool_for(model, roomier, torch.device("cpu")).blocks.num_blocks == 32


def test_an_mla_model_preempted_resumes_token_for_token(smollm2_tokenizer):
    """DeepSeek V3 caches values narrower than keys: a swap copies the two apart."""
    from tests.arch_families import BY_TYPE
    from tests.arch_families import VOCAB as TINY_VOCAB

    mla = BY_TYPE["deepseek_v3"].build(seed=0)
    rng = random.Random(5)
    long_prompt = [rng.randrange(3, TINY_VOCAB) for _ in range(170)]
    roomy = EngineHarness(mla, smollm2_tokenizer, [EOS], max_num_seqs=20, max_model_len=256)
    tight = EngineHarness(mla, smollm2_tokenizer, [EOS], **POOL)
    for harness in (roomy, tight):
        harness.add("running", long_prompt[:8], RUNNING)
        harness.add("long", long_prompt, LONG)
    run_until_preempted(tight)
    for harness in (roomy, tight):
        harness.run()
    for request_id in ("running", "long"):
        assert all_choices(tight, request_id, 8) == all_choices(roomy, request_id, 8), request_id
