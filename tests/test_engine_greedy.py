"""Greedy decoding through the engine equals transformers' generate(), alone and under concurrency."""

from __future__ import annotations

import random

import pytest
import torch

from decoding.params import GenerationParams
from tests.engine_harness import EngineHarness, hf_greedy, tiny_llama

EOS = 2


@pytest.fixture(scope="module")
def model(smollm2_tokenizer):
    return tiny_llama(len(smollm2_tokenizer), seed=1)


def random_prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 49152) for _ in range(rng.randrange(1, 60))] for _ in range(count)]


def test_greedy_equals_hf_generate_alone(model, smollm2_tokenizer):
    for i, prompt in enumerate(random_prompts(4)):
        harness = EngineHarness(model, smollm2_tokenizer, [EOS])
        harness.add("r", prompt, GenerationParams(max_new_tokens=24))
        harness.run()
        assert harness.token_ids("r") == hf_greedy(model, prompt, 24, eos_token_id=EOS), f"prompt {i}"


def test_chunked_prefill_gives_the_same_tokens(model, smollm2_tokenizer):
    prompt = random_prompts(1, seed=5)[0] * 3
    harness = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_batched_tokens=7)
    harness.add("r", prompt, GenerationParams(max_new_tokens=16))
    harness.run()
    assert harness.token_ids("r") == hf_greedy(model, prompt, 16, eos_token_id=EOS)


def top2_gap(model, ids: list[int]) -> float:
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0, -1]
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def test_sixteen_concurrent_greedy_requests_match_alone(model, smollm2_tokenizer):
    prompts = random_prompts(16, seed=3)
    harness = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_seqs=16, max_num_batched_tokens=64)
    for i, prompt in enumerate(prompts):
        harness.add(f"r{i}", prompt, GenerationParams(max_new_tokens=20))
    harness.run()
    for i, prompt in enumerate(prompts):
        expected = hf_greedy(model, prompt, 20, eos_token_id=EOS)
        got = harness.token_ids(f"r{i}")
        if got != expected:
            # float non-associativity may only flip a near-tie; show that it was one
            k = next(j for j, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b)
            gap = top2_gap(model, prompt + expected[:k])
            assert gap < 1e-4, f"request {i} diverged at token {k} with top-2 gap {gap}"


def test_more_requests_than_slots_queue_and_finish(model, smollm2_tokenizer):
    prompts = random_prompts(6, seed=9)
    harness = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_seqs=2)
    for i, prompt in enumerate(prompts):
        harness.add(f"r{i}", prompt, GenerationParams(max_new_tokens=8))
    harness.run()
    for i, prompt in enumerate(prompts):
        assert harness.token_ids(f"r{i}") == hf_greedy(model, prompt, 8, eos_token_id=EOS)
    assert harness.engine.pool.num_free == harness.engine.pool.num_slots


def test_n_greedy_choices_are_identical(model, smollm2_tokenizer):
    prompt = random_prompts(1, seed=11)[0]
    harness = EngineHarness(model, smollm2_tokenizer, [EOS])
    harness.add("r", prompt, GenerationParams(max_new_tokens=10, n=3))
    harness.run()
    expected = hf_greedy(model, prompt, 10, eos_token_id=EOS)
    assert [harness.token_ids("r", i) for i in range(3)] == [expected] * 3


def test_length_and_abort_free_slots(model, smollm2_tokenizer):
    harness = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_seqs=4)
    harness.add("a", [5, 6, 7], GenerationParams(max_new_tokens=3, ignore_eos=True))
    harness.add("b", [5, 6, 7], GenerationParams(max_new_tokens=50, ignore_eos=True))
    with torch.inference_mode():
        for _ in range(3):
            harness.engine.step()
    harness.engine.abort("b")
    harness.run()
    assert harness.finish_reason("a") == "length"
    assert len(harness.token_ids("a")) == 3
    assert harness.outputs["b"][-1].finished
    assert harness.engine.pool.num_free == harness.engine.pool.num_slots
