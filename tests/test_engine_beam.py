"""Beam search and beam sampling through the engine equal transformers' generate(), alone and batched."""

from __future__ import annotations

import random

import pytest
import torch

from decoding.params import GenerationParams
from tests.engine_harness import EngineHarness, tiny_llama

EOS = 2
VOCAB = 64  # small, so eos is a real candidate and early stopping paths run


@pytest.fixture(scope="module")
def model():
    return tiny_llama(VOCAB, seed=3, num_layers=2)


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB) for _ in range(rng.randrange(2, 30))] for _ in range(count)]


def hf_beam(model, prompt: list[int], seed: int | None = None, **kwargs) -> tuple[list[list[int]], list[float]]:
    if seed is not None:
        torch.manual_seed(seed)
    kwargs.setdefault("top_k", 0)  # GenerationConfig would default to 50; our requests have no top_k unless asked
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            eos_token_id=EOS,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
            **kwargs,
        )
    sequences = []
    for row in out.sequences[:, len(prompt) :].tolist():
        # HF pads finished sequences; ours stop at eos (which they include)
        if EOS in row:
            row = row[: row.index(EOS) + 1]
        sequences.append(row)
    return sequences, out.sequences_scores.tolist()


def engine_beam(harness: EngineHarness, request_id: str, n: int) -> tuple[list[list[int]], list[float]]:
    sequences = [harness.token_ids(request_id, i) for i in range(n)]
    return sequences, harness.sequence_scores(request_id)


def beam_params(hf_kwargs: dict) -> GenerationParams:
    kwargs = dict(hf_kwargs)
    n = kwargs.get("num_return_sequences", 1)
    return GenerationParams(**kwargs, n=n, logprobs=0)


def assert_same(ours, theirs, label: str) -> None:
    assert ours[0] == theirs[0], label
    assert ours[1] == pytest.approx(theirs[1], abs=1e-4), label


CASES = [
    dict(num_beams=4, max_new_tokens=12),
    dict(num_beams=4, max_new_tokens=12, early_stopping=True),
    dict(num_beams=4, max_new_tokens=12, early_stopping="never"),
    dict(num_beams=3, max_new_tokens=10, length_penalty=0.5, num_return_sequences=3),
    dict(num_beams=4, max_new_tokens=10, length_penalty=2.0, early_stopping="never", num_return_sequences=2),
    dict(num_beams=2, max_new_tokens=14, no_repeat_ngram_size=2, min_new_tokens=5),
    dict(num_beams=5, max_new_tokens=8, repetition_penalty=1.3, num_return_sequences=5),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_beam_search_equals_hf_generate(model, smollm2_tokenizer, case):
    for p, prompt in enumerate(prompts(3, seed=7)):
        harness = EngineHarness(model, smollm2_tokenizer, [EOS])
        harness.add("r", prompt, beam_params(case))
        harness.run()
        n = case.get("num_return_sequences", 1)
        assert_same(engine_beam(harness, "r", n), hf_beam(model, prompt, **case), f"prompt {p}")


SAMPLE_CASES = [
    dict(num_beams=3, do_sample=True, max_new_tokens=10, top_k=20),
    dict(num_beams=4, do_sample=True, max_new_tokens=10, temperature=0.7, top_p=0.9, num_return_sequences=2),
]


@pytest.mark.parametrize("case", SAMPLE_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_beam_sampling_equals_hf_generate_with_the_same_seed(model, smollm2_tokenizer, case):
    for p, prompt in enumerate(prompts(3, seed=11)):
        harness = EngineHarness(model, smollm2_tokenizer, [EOS])
        harness.add("r", prompt, beam_params(case).replace(seed=100 + p))
        harness.run()
        n = case.get("num_return_sequences", 1)
        assert_same(engine_beam(harness, "r", n), hf_beam(model, prompt, seed=100 + p, **case), f"prompt {p}")


def test_beam_requests_batched_with_greedy_and_sampling_keep_their_results(model, smollm2_tokenizer):
    beam_cases = [CASES[0], CASES[3], SAMPLE_CASES[0], CASES[4]]
    work = prompts(8, seed=21)
    alone = []
    for i, case in enumerate(beam_cases):
        harness = EngineHarness(model, smollm2_tokenizer, [EOS])
        harness.add("r", work[i], beam_params(case).replace(seed=5))
        harness.run()
        alone.append(engine_beam(harness, "r", case.get("num_return_sequences", 1)))
    crowd = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_seqs=32, max_num_batched_tokens=24)
    for i, case in enumerate(beam_cases):
        crowd.add(f"beam{i}", work[i], beam_params(case).replace(seed=5))
        crowd.add(f"greedy{i}", work[4 + i], GenerationParams(max_new_tokens=9))
        crowd.add(f"sample{i}", work[i], GenerationParams(max_new_tokens=7, do_sample=True, seed=i))
    crowd.run()
    for i, case in enumerate(beam_cases):
        ours = engine_beam(crowd, f"beam{i}", case.get("num_return_sequences", 1))
        assert ours[0] == alone[i][0]
        assert ours[1] == pytest.approx(alone[i][1], abs=1e-5)
    assert all(crowd.finish_reason(f"greedy{i}") for i in range(4))


REAL_CASES = [
    dict(num_beams=4, max_new_tokens=20),
    dict(num_beams=4, max_new_tokens=20, early_stopping=True, num_return_sequences=2),
    dict(num_beams=3, max_new_tokens=16, early_stopping="never", length_penalty=0.6, num_return_sequences=3),
]


@pytest.mark.slow
def test_beam_search_equals_hf_generate_on_the_embedded_model(smollm2):
    from tests.test_engine_real_model import PROMPTS, chat_ids

    eos = smollm2.eos_token_ids
    for case in REAL_CASES:
        harness = EngineHarness(smollm2.model, smollm2.tokenizer, eos, max_model_len=256)
        prompts = [chat_ids(smollm2.tokenizer, p) for p in PROMPTS[:2]]
        for i, prompt in enumerate(prompts):
            harness.add(f"r{i}", prompt, beam_params(case))
        harness.run()  # both at once
        n = case.get("num_return_sequences", 1)
        for i, prompt in enumerate(prompts):
            with torch.inference_mode():
                out = smollm2.model.generate(
                    torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                    output_scores=True, return_dict_in_generate=True, do_sample=False, **case,
                )  # fmt: skip
            pad = smollm2.model.generation_config.pad_token_id
            theirs = []
            for row in out.sequences[:, len(prompt) :].tolist():
                cut = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
                theirs.append(row[:cut] if cut < len(row) or pad is None else row)
            assert_same(engine_beam(harness, f"r{i}", n), (theirs, out.sequences_scores.tolist()), f"{case} {i}")
