"""The embedded SmolLM2-135M-Instruct through the engine equals transformers' generate()."""

from __future__ import annotations

import pytest

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
