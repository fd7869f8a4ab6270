"""Every batched knob equals transformers' own LogitsProcessor/Warper applied to that row alone."""

from __future__ import annotations

import random

import pytest
import torch
from transformers.generation import logits_process as hf

from decoding.params import GenerationParams
from decoding.sampling import RowSamplingState, SamplingBatch

VOCAB = 64
EOS = [3, 7]


def make_rows(params_list: list[GenerationParams], seed: int = 0) -> tuple[list[RowSamplingState], list[list[int]]]:
    rng = random.Random(seed)
    rows, histories = [], []
    for params in params_list:
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 12))]
        row = RowSamplingState(params, prompt, EOS, VOCAB, None)
        for _ in range(rng.randrange(0, 6)):
            row.append(rng.randrange(VOCAB))
        rows.append(row)
        histories.append(row.history)
    return rows, histories


def random_logits(num_rows: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(num_rows, VOCAB, generator=g) * 3


def check(params_list, hf_processor_for, seed: int = 0) -> None:
    """hf_processor_for(params, row) -> list of HF processors for that row (empty: untouched)."""
    rows, histories = make_rows(params_list, seed)
    logits = random_logits(len(rows), seed)
    ours = SamplingBatch.from_rows(rows).process(logits)
    for i, (params, row) in enumerate(zip(params_list, rows, strict=True)):
        expected = logits[i : i + 1].clone()
        input_ids = torch.tensor([histories[i]])
        for processor in hf_processor_for(params, row):
            expected = processor(input_ids, expected)
        torch.testing.assert_close(ours[i : i + 1], expected, rtol=0, atol=0, msg=f"row {i}")


S = dict(do_sample=True)


def test_temperature():
    check(
        [GenerationParams(temperature=t, **S) for t in (0.5, 1.0, 1.7)] + [GenerationParams(temperature=0.3)],
        lambda p, r: [hf.TemperatureLogitsWarper(p.temperature)] if p.do_sample and p.temperature != 1 else [],
    )


def test_top_k():
    check(
        [GenerationParams(top_k=k, **S) for k in (1, 5, 40)] + [GenerationParams(**S), GenerationParams(top_k=3)],
        lambda p, r: [hf.TopKLogitsWarper(p.top_k)] if p.do_sample and p.top_k else [],
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_top_p(seed):
    check(
        [GenerationParams(top_p=v, **S) for v in (0.1, 0.5, 0.9, 0.95, 1.0)],
        lambda p, r: [hf.TopPLogitsWarper(p.top_p)] if p.top_p < 1 else [],
        seed,
    )


def test_min_p():
    check(
        [GenerationParams(min_p=v, **S) for v in (0.0, 0.05, 0.3)] + [GenerationParams(**S)],
        lambda p, r: [hf.MinPLogitsWarper(p.min_p)] if p.min_p is not None else [],
    )


def test_typical_p():
    check(
        [GenerationParams(typical_p=v, **S) for v in (0.2, 0.9, 1.0)],
        lambda p, r: [hf.TypicalLogitsWarper(p.typical_p)] if p.typical_p < 1 else [],
    )


def test_epsilon_and_eta():
    check(
        [GenerationParams(epsilon_cutoff=v, **S) for v in (0.0, 0.01, 0.05)],
        lambda p, r: [hf.EpsilonLogitsWarper(p.epsilon_cutoff)] if p.epsilon_cutoff else [],
    )
    check(
        [GenerationParams(eta_cutoff=v, **S) for v in (0.0, 0.001, 0.05)],
        lambda p, r: [hf.EtaLogitsWarper(p.eta_cutoff, device="cpu")] if p.eta_cutoff else [],
    )


def test_repetition_penalty():
    check(
        [GenerationParams(repetition_penalty=v) for v in (1.0, 1.2, 0.8)]
        + [GenerationParams(repetition_penalty=1.3, **S)],
        lambda p, r: [hf.RepetitionPenaltyLogitsProcessor(p.repetition_penalty)] if p.repetition_penalty != 1 else [],
    )


def test_no_repeat_ngram():
    for seed in range(5):
        check(
            [GenerationParams(no_repeat_ngram_size=n) for n in (0, 1, 2, 3)],
            lambda p, r: [hf.NoRepeatNGramLogitsProcessor(p.no_repeat_ngram_size)] if p.no_repeat_ngram_size else [],
            seed,
        )


def test_bad_words():
    rows, histories = make_rows([GenerationParams()], seed=4)
    history = histories[0]
    bad = [[5], [history[-1], 9], [history[-2], history[-1], 11], [1, 2, 12]]
    check(
        [GenerationParams(bad_words_ids=bad), GenerationParams()],
        lambda p, r: [hf.NoBadWordsLogitsProcessor(p.bad_words_ids, eos_token_id=None)] if p.bad_words_ids else [],
        seed=4,
    )


def test_min_new_tokens():
    def hf_min(p, r):
        prompt_len = len(r.history) - r.num_generated
        return [hf.MinNewTokensLengthLogitsProcessor(prompt_len, p.min_new_tokens, EOS)] if p.min_new_tokens else []

    check([GenerationParams(min_new_tokens=v) for v in (0, 1, 3, 50)], hf_min)


def test_suppress_tokens():
    check(
        [GenerationParams(suppress_tokens=[1, 4, 60]), GenerationParams()],
        lambda p, r: [hf.SuppressTokensLogitsProcessor(p.suppress_tokens)] if p.suppress_tokens else [],
    )


def test_logit_bias_and_openai_penalties():
    rows, _ = make_rows([GenerationParams(presence_penalty=0.5, frequency_penalty=0.7), GenerationParams()], seed=2)
    logits = random_logits(2, seed=2)
    out = SamplingBatch.from_rows(rows).process(logits)
    generated = rows[0].history[len(rows[0].history) - rows[0].num_generated :]
    expected = logits[0].clone()
    for token in set(generated):
        expected[token] -= 0.5 + 0.7 * generated.count(token)
    torch.testing.assert_close(out[0], expected)
    torch.testing.assert_close(out[1], logits[1], rtol=0, atol=0)
    rows, _ = make_rows([GenerationParams(logit_bias={5: 100.0, 6: -100.0})])
    out = SamplingBatch.from_rows(rows).process(random_logits(1))
    assert out[0].argmax() == 5 and out[0, 6] < -90


def test_all_knobs_together_in_hf_order():
    params = GenerationParams(
        do_sample=True, temperature=0.7, top_k=20, top_p=0.9, min_p=0.02, typical_p=0.95, epsilon_cutoff=0.001,
        eta_cutoff=0.001, repetition_penalty=1.2, no_repeat_ngram_size=2, bad_words_ids=[[5]],
        min_new_tokens=100, suppress_tokens=[8],
    )  # fmt: skip

    def hf_list(p, r):
        if not p.do_sample:
            return []
        prompt_len = len(r.history) - r.num_generated
        return [
            hf.RepetitionPenaltyLogitsProcessor(p.repetition_penalty),
            hf.NoRepeatNGramLogitsProcessor(p.no_repeat_ngram_size),
            hf.NoBadWordsLogitsProcessor(p.bad_words_ids, eos_token_id=None),
            hf.MinNewTokensLengthLogitsProcessor(prompt_len, p.min_new_tokens, EOS),
            hf.SuppressTokensLogitsProcessor(p.suppress_tokens),
            hf.TemperatureLogitsWarper(p.temperature),
            hf.TopKLogitsWarper(p.top_k),
            hf.TopPLogitsWarper(p.top_p),
            hf.MinPLogitsWarper(p.min_p),
            hf.TypicalLogitsWarper(p.typical_p),
            hf.EpsilonLogitsWarper(p.epsilon_cutoff),
            hf.EtaLogitsWarper(p.eta_cutoff, device="cpu"),
        ]

    for seed in range(3):
        check([params, GenerationParams(), params], hf_list, seed)


def test_fast_path_returns_logits_untouched():
    rows, _ = make_rows([GenerationParams(), GenerationParams()])
    batch = SamplingBatch.from_rows(rows)
    logits = random_logits(2)
    assert batch.process(logits) is logits
    assert batch.sample(logits) == logits.argmax(-1).tolist()
