"""The per-request token tries answer exactly what checking every sequence against the history does."""

from __future__ import annotations

import random

import torch

from decoding import GenerationParams
from decoding.sampling.token_rules import TokenRules

VOCAB = 50


def _naive_bans(bad_words: list[list[int]], history: list[int]) -> set[int]:
    banned = set()
    for words in bad_words:
        prefix = words[:-1]
        if not prefix or (len(prefix) <= len(history) and history[len(history) - len(prefix) :] == prefix):
            banned.add(words[-1])
    return banned


def _naive_bias(pairs: list, history: list[int]) -> torch.Tensor:
    single = [p for p in pairs if len(p[0]) == 1]
    longer = [p for p in pairs if len(p[0]) > 1]
    lengths = list(dict.fromkeys(len(p[0]) for p in longer))
    bias = torch.zeros(VOCAB, dtype=torch.float32)
    for ids, value in single + [p for n in lengths for p in longer if len(p[0]) == n]:
        prefix = ids[:-1]
        if not prefix or (len(prefix) <= len(history) and history[len(history) - len(prefix) :] == prefix):
            bias[ids[-1]] += value
    return bias


def test_bans_and_biases_equal_the_sequence_by_sequence_check_on_random_histories():
    rng = random.Random(0)
    for trial in range(40):
        # a small alphabet so prefixes often match, sequences sharing prefixes, the same last token twice
        bad_words = [[rng.randrange(4) for _ in range(rng.randint(1, 4))] for _ in range(rng.randint(1, 12))]
        seen: set[tuple[int, ...]] = set()
        pairs = []
        for _ in range(rng.randint(1, 12)):
            ids = [rng.randrange(4) for _ in range(rng.randint(1, 4))]
            if tuple(ids) not in seen:
                seen.add(tuple(ids))
                pairs.append([ids, rng.choice([0.1, -0.7, 1e-3, 3.3])])
        rules = TokenRules(GenerationParams(bad_words_ids=bad_words, sequence_bias=pairs), VOCAB, torch.device("cpu"))
        for _ in range(20):
            history = [rng.randrange(4) for _ in range(rng.randint(0, 6))]
            assert rules.banned_bad_words(history) == _naive_bans(bad_words, history), (trial, history)
            assert torch.equal(rules.sequence_bias_row(history), _naive_bias(pairs, history)), (trial, history)


def test_rows_of_one_request_share_its_rules_built_once():
    params = GenerationParams(bad_words_ids=[[1, 2]], suppress_tokens=[3, 3, 4])
    first = TokenRules.of(params, VOCAB, torch.device("cpu"))
    assert TokenRules.of(params, VOCAB, torch.device("cpu")) is first
    assert first.suppress.tolist() == [3, 4]  # duplicates once
    other = GenerationParams(bad_words_ids=[[1, 2]])
    assert TokenRules.of(other, VOCAB, torch.device("cpu")) is not first
