"""Seeded sampling: reproducible whatever shares the batch, matching the processed distribution and HF."""

from __future__ import annotations

import torch

from decoding.params import GenerationParams
from decoding.sampling import RowSamplingState, SamplingBatch, make_generator
from tests.engine_harness import EngineHarness, tiny_llama

VOCAB = 8


def row(params: GenerationParams, seed: int | None) -> RowSamplingState:
    return RowSamplingState(params, [1, 2], [0], VOCAB, make_generator(seed) if params.do_sample else None)


def draws(batch_params: list[tuple[GenerationParams, int | None]], logits: torch.Tensor, steps: int) -> list[list[int]]:
    rows = [row(p, s) for p, s in batch_params]
    batch = SamplingBatch.from_rows(rows)
    out = [[] for _ in rows]
    for _ in range(steps):
        for i, token in enumerate(batch.sample(batch.process(logits))):
            out[i].append(token)
    return out


def test_seeded_rows_reproduce_whatever_else_is_in_the_batch():
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(0))
    p = GenerationParams(do_sample=True, temperature=0.8, seed=42)
    alone = draws([(p, 42)], logits, 50)[0]
    crowd = draws([(GenerationParams(do_sample=True), 7), (p, 42), (GenerationParams(), None)], logits.repeat(3, 1), 50)
    assert crowd[1] == alone
    assert draws([(p, 42)], logits, 50)[0] == alone
    assert draws([(p, 43)], logits, 50)[0] != alone


def test_token_frequencies_match_the_processed_distribution():
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0]])
    params = GenerationParams(do_sample=True, temperature=0.7, top_k=5)
    batch = SamplingBatch.from_rows([row(params, 1234)])
    expected = torch.softmax(batch.process(logits), dim=-1)[0]
    n = 20_000
    counts = torch.zeros(VOCAB)
    for _ in range(n):
        counts[batch.sample(batch.process(logits))[0]] += 1
    assert counts[5:].sum() == 0  # outside top_k: never drawn
    observed, wanted = counts[:5], expected[:5] * n
    chi2 = float(((observed - wanted) ** 2 / wanted).sum())
    assert chi2 < 18.47, f"chi-square {chi2:.2f} with 4 dof exceeds the 0.001 critical value"


def test_seeded_sampling_equals_hf_generate_with_the_same_seed():
    vocab = 256
    model = tiny_llama(vocab, seed=3)

    class ByteTokenizer:  # the engine only needs decode() for text
        def decode(self, ids, skip_special_tokens=False):
            return "".join(chr(65 + i % 26) for i in ids)

        def convert_ids_to_tokens(self, ids):
            return [chr(65 + i % 26) for i in ids]

        all_special_ids: list[int] = []

    prompt = [5, 17, 99, 42]
    knobs = dict(do_sample=True, temperature=0.9, top_k=50, top_p=0.9)
    harness = EngineHarness(model, ByteTokenizer(), [2])
    harness.add("r", prompt, GenerationParams(max_new_tokens=20, seed=7, **knobs))
    harness.run()
    torch.manual_seed(7)
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=20, eos_token_id=2, **knobs)
    assert harness.token_ids("r") == out[0, len(prompt) :].tolist()
