"""Classifier-free guidance through the engine equals transformers' generate(guidance_scale=...),
whose ``UnbatchedClassifierFreeGuidanceLogitsProcessor`` runs the unconditional branch itself;
here it is a second row of the shared forward."""

from __future__ import annotations

import random

import pytest
import torch

from decoding.params import GenerationParams
from tests.engine_harness import EngineHarness, tiny_llama

EOS = 2


@pytest.fixture(scope="module")
def model(smollm2_tokenizer):
    return tiny_llama(len(smollm2_tokenizer), seed=7)


def ids(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 49152) for _ in range(length)]


def hf_generate(model, prompt: list[int], seed: int | None = None, **kwargs) -> list[int]:
    negative = kwargs.pop("negative_prompt_ids", None)
    if negative is not None:
        kwargs["negative_prompt_ids"] = torch.tensor([negative])
    if seed is not None:
        torch.manual_seed(seed)
    if kwargs.get("do_sample"):
        kwargs.setdefault("top_k", 0)  # GenerationConfig would default to 50; our requests have none unless asked
    kwargs.setdefault("eos_token_id", EOS)
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            pad_token_id=0,
            **kwargs,
        )
    return out[0, len(prompt) :].tolist()


def ours(model, tokenizer, prompt: list[int], **knobs) -> list[int]:
    harness = EngineHarness(model, tokenizer, [EOS])
    harness.add("r", prompt, GenerationParams(**knobs))
    harness.run()
    assert harness.engine.pool.num_free == harness.engine.pool.num_slots  # both rows' slots came back
    return harness.token_ids("r")


def test_the_mix_is_hf_s_processor():
    from transformers.generation.logits_process import UnbatchedClassifierFreeGuidanceLogitsProcessor
    from transformers.modeling_outputs import CausalLMOutputWithPast

    from decoding.strategies.guidance import guided_scores

    generator = torch.Generator().manual_seed(0)
    cond, uncond = torch.randn(1, 50, generator=generator), torch.randn(1, 50, generator=generator)
    for scale in (0.5, 1.5, 7.0):
        processor = UnbatchedClassifierFreeGuidanceLogitsProcessor(
            scale, lambda *args, **kwargs: CausalLMOutputWithPast(logits=uncond[:, None])
        )
        expected = processor(torch.tensor([[3, 4]]), cond.clone())
        assert torch.equal(guided_scores(cond[0], uncond[0], scale), expected[0])


CASES = [
    dict(guidance_scale=1.5),
    dict(guidance_scale=3.0, negative_prompt_ids=ids(50, 9)),
    dict(guidance_scale=0.5, negative_prompt_ids=ids(51, 1)),
]


@pytest.mark.parametrize("knobs", CASES, ids=["last-token", "negative-prompt", "below-one"])
def test_greedy_guidance_equals_hf_generate(model, smollm2_tokenizer, knobs):
    changed = 0
    for i in range(3):
        prompt = ids(i, 5 + 11 * i)
        expected = hf_generate(model, prompt, max_new_tokens=20, do_sample=False, **knobs)
        assert ours(model, smollm2_tokenizer, prompt, max_new_tokens=20, **knobs) == expected, f"prompt {i}"
        changed += expected != hf_generate(model, prompt, max_new_tokens=20, do_sample=False)
    assert changed, "guidance should change some tokens, or this test proves nothing"


@pytest.mark.parametrize("knobs", CASES[:2], ids=["last-token", "negative-prompt"])
def test_seeded_sampling_guidance_equals_hf_generate(model, smollm2_tokenizer, knobs):
    sampling = dict(do_sample=True, temperature=0.8, top_p=0.95, repetition_penalty=1.1)
    for seed in (0, 1):
        prompt = ids(10 + seed, 12)
        expected = hf_generate(model, prompt, seed=seed, max_new_tokens=16, **sampling, **knobs)
        got = ours(model, smollm2_tokenizer, prompt, max_new_tokens=16, seed=seed, **sampling, **knobs)
        assert got == expected, f"seed {seed}"


def test_a_long_negative_prompt_is_fed_in_chunks(model, smollm2_tokenizer, monkeypatch):
    from decoding.strategies import guidance

    monkeypatch.setattr(guidance, "NEGATIVE_PROMPT_CHUNK", 4)
    knobs = dict(guidance_scale=2.0, negative_prompt_ids=ids(60, 15))
    prompt = ids(61, 7)
    expected = hf_generate(model, prompt, max_new_tokens=10, do_sample=False, **knobs)
    assert ours(model, smollm2_tokenizer, prompt, max_new_tokens=10, **knobs) == expected


def test_guidance_in_a_mixed_batch_is_unchanged(model, smollm2_tokenizer):
    guided = GenerationParams(max_new_tokens=14, guidance_scale=2.5, negative_prompt_ids=ids(70, 6))
    guided_sampled = GenerationParams(max_new_tokens=14, do_sample=True, seed=5, guidance_scale=1.7, n=2)
    alone = {}
    for name, params in (("g", guided), ("s", guided_sampled)):
        harness = EngineHarness(model, smollm2_tokenizer, [EOS])
        harness.add(name, ids(71, 10), params)
        harness.run()
        alone[name] = [harness.token_ids(name, i) for i in range(params.n)]

    crowd = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_batched_tokens=16)
    crowd.add("greedy", ids(80, 30), GenerationParams(max_new_tokens=12))
    crowd.add("g", ids(71, 10), guided)
    crowd.add("beam", ids(81, 8), GenerationParams(max_new_tokens=8, num_beams=3))
    crowd.add("s", ids(71, 10), guided_sampled)
    crowd.add("contrastive", ids(82, 9), GenerationParams(max_new_tokens=8, penalty_alpha=0.6, top_k=4))
    crowd.add("sample", ids(83, 5), GenerationParams(max_new_tokens=12, do_sample=True, seed=9))
    crowd.run()
    for name, expected in alone.items():
        assert [crowd.token_ids(name, i) for i in range(len(expected))] == expected, name
    assert alone["s"][0] != alone["s"][1]  # n rows draw in turn from the request's generator
    assert hf_generate(model, ids(71, 10), max_new_tokens=14, do_sample=False, guidance_scale=2.5,
                       negative_prompt_ids=ids(70, 6)) == alone["g"][0]  # fmt: skip
    assert crowd.engine.pool.num_free == crowd.engine.pool.num_slots


def test_guidance_holds_two_slots_per_row(model, smollm2_tokenizer):
    harness = EngineHarness(model, smollm2_tokenizer, [EOS])
    harness.add("r", ids(90, 5), GenerationParams(max_new_tokens=3, guidance_scale=2.0, n=3, do_sample=True))
    assert harness.engine.strategies["r"].num_slots == 6
    harness.run()
    assert all(len(harness.token_ids("r", i)) == 3 for i in range(3))


@pytest.mark.slow
def test_guidance_on_the_embedded_model_equals_hf_generate(smollm2):
    tokenizer = smollm2.tokenizer
    prompt = tokenizer.encode("Today, a dragon flew over Paris, France,")
    negative = tokenizer.encode("A very happy event happened,")
    harness = EngineHarness(smollm2.model, tokenizer, smollm2.eos_token_ids, max_model_len=256)
    harness.add("plain", prompt, GenerationParams(max_new_tokens=16, guidance_scale=1.5))
    harness.add(
        "negative", prompt, GenerationParams(max_new_tokens=16, guidance_scale=2.0, negative_prompt_ids=negative)
    )
    harness.run()
    eos = smollm2.eos_token_ids
    plain = hf_generate(smollm2.model, prompt, max_new_tokens=16, do_sample=False, guidance_scale=1.5, eos_token_id=eos)
    assert harness.token_ids("plain") == plain
    with_negative = hf_generate(smollm2.model, prompt, max_new_tokens=16, do_sample=False, guidance_scale=2.0,
                                negative_prompt_ids=negative, eos_token_id=eos)  # fmt: skip
    assert harness.token_ids("negative") == with_negative
