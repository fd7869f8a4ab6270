"""The embedded SmolLM2-135M-Instruct through the engine equals transformers' generate()."""

from __future__ import annotations

import pytest
import torch

from decoding.params import GenerationParams
from tests.engine_harness import EngineHarness, hf_greedy

pytestmark = pytest.mark.slow

PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about autumn leaves.",
    "Explain in one sentence why the sky is blue.",
]


def chat_ids(tokenizer, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_greedy_equals_hf_generate_on_the_embedded_model(smollm2):
    harness = EngineHarness(smollm2.model, smollm2.tokenizer, smollm2.eos_token_ids, max_model_len=512)
    prompts = [chat_ids(smollm2.tokenizer, p) for p in PROMPTS]
    for i, prompt in enumerate(prompts):
        harness.add(f"r{i}", prompt, GenerationParams(max_new_tokens=32))
    harness.run()  # all three at once: concurrency must not change greedy tokens
    for i, prompt in enumerate(prompts):
        expected = hf_greedy(smollm2.model, prompt, 32)
        assert harness.token_ids(f"r{i}") == expected, PROMPTS[i]
        assert harness.text(f"r{i}") == smollm2.tokenizer.decode(expected, skip_special_tokens=True)


def test_the_issue_24_preemption_reproduction_answers_all_three(smollm2):
    """``--kv-cache-memory 64MB --max-model-len 1024``: a request with n=8 runs, a second with a
    700-token prompt and n=8 is preempted, a third small one queues behind it; all three answer as
    with ample memory. Before, the second was copied out row by row (8 x 44 prompt blocks, four times
    the 86-block pool): it never resumed and the third was never admitted."""
    tokenizer = smollm2.tokenizer
    story = tokenizer("Once upon a time the river carried boats of grain past the old mill, " * 60)["input_ids"]
    running = GenerationParams(max_new_tokens=60, n=8, do_sample=True, seed=1, ignore_eos=True)
    long = GenerationParams(max_new_tokens=40, n=8, do_sample=True, seed=2, ignore_eos=True)
    settings = dict(max_model_len=1024, max_num_seqs=16)
    roomy = EngineHarness(smollm2.model, tokenizer, smollm2.eos_token_ids, **settings)
    tight = EngineHarness(smollm2.model, tokenizer, smollm2.eos_token_ids, **settings, kv_cache_bytes=64_000_000)
    assert tight.engine.pool.blocks.num_blocks == 86
    for harness in (roomy, tight):
        harness.add("running", chat_ids(tokenizer, PROMPTS[1]), running)
        harness.add("long", story[:700], long)
    for _ in range(200):
        if tight.engine.scheduler.preempted:
            break
        with torch.inference_mode():
            tight.engine.step()
    assert tight.engine.scheduler.swapped_blocks(tight.engine.strategies["long"]) <= 86
    for harness in (roomy, tight):
        harness.add("small", chat_ids(tokenizer, PROMPTS[0]), GenerationParams(max_new_tokens=16))
        harness.run()
    for request_id, n in (("running", 8), ("long", 8), ("small", 1)):
        assert tight.outputs[request_id][-1].error is None, request_id
        for index in range(n):
            assert tight.token_ids(request_id, index) == roomy.token_ids(request_id, index), (request_id, index)
