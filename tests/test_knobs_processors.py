"""The length and sequence knobs (issue 11), batched, equal transformers' own processors row by row.

Each test mixes rows that set a knob with rows that do not (those must stay bit-for-bit
untouched) and compares every row with HF's class applied to that row alone, with atol=0.
"""

from __future__ import annotations

import torch
from transformers.generation import logits_process as hf

from decoding.params import GenerationParams
from decoding.sampling import RowSamplingState, SamplingBatch

VOCAB = 64
EOS = [3, 7]


def row_with(params: GenerationParams, prompt: list[int], generated: list[int]) -> RowSamplingState:
    row = RowSamplingState(params, prompt, EOS, VOCAB, None)
    for token in generated:
        row.append(token)
    return row


def logits_for(num_rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(num_rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def check(cases: list[tuple[GenerationParams, list[int], list[int]]], processors_for) -> None:  # noqa: ANN001
    """processors_for(params, prompt_len) -> HF processors for that row (empty: untouched)."""
    rows = [row_with(*case) for case in cases]
    logits = logits_for(len(rows))
    ours = SamplingBatch.from_rows(rows).process(logits)
    for i, ((params, prompt, _), row) in enumerate(zip(cases, rows, strict=True)):
        expected = logits[i : i + 1].clone()
        input_ids = torch.tensor([row.history])
        for processor in processors_for(params, len(prompt)):
            expected = processor(input_ids, expected)
        torch.testing.assert_close(ours[i : i + 1], expected, rtol=0, atol=0, msg=f"row {i}")


def test_sequence_bias_single_and_multi_token():
    bias = [[[5], 2.5], [[9, 11], -4.0], [[1, 2, 12], 3.0], [[12], 1.0], [[40, 41, 42, 43, 44, 45, 46], 9.0]]
    cases = [
        (GenerationParams(sequence_bias=bias), [1, 2, 9], [1, 2]),  # [1, 2] ends the history: 12 biased
        (GenerationParams(sequence_bias=bias), [4], [9]),  # 9 ends it: 11 biased
        (GenerationParams(sequence_bias=bias), [4], []),  # shorter than the 7-token sequence
        (GenerationParams(), [1, 2], [9]),  # untouched
    ]

    def processors(params: GenerationParams, prompt_len: int) -> list:
        if not params.sequence_bias:
            return []
        return [hf.SequenceBiasLogitsProcessor({tuple(ids): float(b) for ids, b in params.sequence_bias})]

    check(cases, processors)


def test_min_length_counts_the_prompt():
    cases = [
        (GenerationParams(min_length=6), [1, 2, 4], [5]),  # 4 < 6: eos banned
        (GenerationParams(min_length=4), [1, 2, 4], [5]),  # 4 == 4: allowed
        (GenerationParams(), [1], []),
    ]
    check(cases, lambda p, n: [hf.MinLengthLogitsProcessor(p.min_length, EOS)] if p.min_length else [])


def test_forced_bos_only_when_input_is_one_token():
    cases = [
        (GenerationParams(forced_bos_token_id=17), [4], []),  # cur_len 1: forced
        (GenerationParams(forced_bos_token_id=17), [4, 5], []),  # cur_len 2: untouched, as in HF
        (GenerationParams(), [4], []),
    ]
    check(cases, lambda p, n: [] if p.forced_bos_token_id is None else [hf.ForcedBOSTokenLogitsProcessor(17)])


def test_forced_eos_the_step_before_max_length():
    cases = [
        (GenerationParams(forced_eos_token_id=[3, 8], max_new_tokens=3), [1, 2], [5, 6]),  # fires: 4 == 5 - 1
        (GenerationParams(forced_eos_token_id=8, max_new_tokens=4), [1, 2], [5, 6]),  # not yet
        (GenerationParams(forced_eos_token_id=8, max_length=5), [1, 2], [5, 6]),  # max_length given
        (GenerationParams(), [1], [2]),
    ]

    def processors(params: GenerationParams, prompt_len: int) -> list:
        if params.forced_eos_token_id is None:
            return []
        max_length = params.max_length if params.max_length is not None else prompt_len + params.max_new_tokens
        return [hf.ForcedEOSTokenLogitsProcessor(max_length, params.forced_eos_token_id)]

    check(cases, processors)


def test_exponential_decay_length_penalty():
    cases = [
        (GenerationParams(exponential_decay_length_penalty=(1, 1.5)), [1, 2], [5, 6, 9]),  # 2 steps past
        (GenerationParams(exponential_decay_length_penalty=(0, 0.8)), [1], [5, 6, 9, 9]),  # shrinking
        (GenerationParams(exponential_decay_length_penalty=(5, 2.0)), [1], [5]),  # not started
        (GenerationParams(), [1], [2]),
    ]

    def processors(params: GenerationParams, prompt_len: int) -> list:
        decay = params.exponential_decay_length_penalty
        return [] if decay is None else [hf.ExponentialDecayLengthPenalty(decay, EOS, prompt_len)]

    check(cases, processors)


def test_exponential_decay_leaves_a_banned_eos_banned():
    """min_length bans eos first; HF masks non-finite scores out of the penalty (no nan)."""
    params = GenerationParams(min_length=10, exponential_decay_length_penalty=(0, 1.5))
    check(
        [(params, [1, 2], [5, 6])],
        lambda p, n: [hf.MinLengthLogitsProcessor(10, EOS), hf.ExponentialDecayLengthPenalty((0, 1.5), EOS, n)],
    )


def test_begin_suppress_tokens_at_the_first_generated_position_only():
    tokens = [0, 13, 21]
    cases = [
        (GenerationParams(begin_suppress_tokens=tokens), [1, 2], []),  # first step: suppressed
        (GenerationParams(begin_suppress_tokens=tokens), [1, 2], [5]),  # second step: untouched
        (GenerationParams(begin_suppress_tokens=tokens, forced_bos_token_id=17), [1], [17]),  # shifted by bos
        (GenerationParams(), [1], []),
    ]

    def processors(params: GenerationParams, prompt_len: int) -> list:
        if not params.begin_suppress_tokens:
            return []
        out = [] if params.forced_bos_token_id is None else [hf.ForcedBOSTokenLogitsProcessor(17)]
        begin = prompt_len + (1 if prompt_len == 1 and params.forced_bos_token_id is not None else 0)
        return out + [hf.SuppressTokensAtBeginLogitsProcessor(tokens, begin)]

    check(cases, processors)


def test_renormalize_logits_last_after_the_warpers():
    cases = [
        (GenerationParams(renormalize_logits=True, do_sample=True, temperature=0.7, top_k=5), [1], [2]),
        (GenerationParams(renormalize_logits=True), [1], []),
        (GenerationParams(do_sample=True, temperature=0.7), [1], []),
    ]

    def processors(params: GenerationParams, prompt_len: int) -> list:
        out = []
        if params.do_sample:
            out.append(hf.TemperatureLogitsWarper(params.temperature))
            if params.top_k:
                out.append(hf.TopKLogitsWarper(params.top_k))
        return out + ([hf.LogitNormalization()] if params.renormalize_logits else [])

    check(cases, processors)


def test_all_knobs_together_in_hf_order():
    params = GenerationParams(
        sequence_bias=[[[3], 4.0], [[5, 3], 2.0]],
        min_length=3,
        exponential_decay_length_penalty=(0, 1.3),
        suppress_tokens=[11],
        begin_suppress_tokens=[12],
        forced_eos_token_id=3,
        max_new_tokens=6,
        renormalize_logits=True,
    )
    prompt, generated = [1, 5], []

    def processors(p: GenerationParams, n: int) -> list:
        return [
            hf.SequenceBiasLogitsProcessor({(3,): 4.0, (5, 3): 2.0}),
            hf.MinLengthLogitsProcessor(3, EOS),
            hf.ForcedEOSTokenLogitsProcessor(n + 6, 3),
            hf.ExponentialDecayLengthPenalty((0, 1.3), EOS, n),
            hf.SuppressTokensLogitsProcessor([11]),
            hf.SuppressTokensAtBeginLogitsProcessor([12], n),
            hf.LogitNormalization(),
        ]

    check([(params, prompt, generated), (params, [1, 5, 8], [9, 5])], processors)


def test_sequence_biases_on_one_token_add_up_as_hfs_dense_tensor():
    bias = [[[4, 5, 12], 0.3], [[5, 12], 0.2], [[12], 0.1], [[9, 12], 7.0]]
    check(
        [(GenerationParams(sequence_bias=bias), [1, 4], [5]), (GenerationParams(sequence_bias=bias), [9], [])],
        lambda p, n: [hf.SequenceBiasLogitsProcessor({tuple(ids): float(b) for ids, b in p.sequence_bias})],
    )
