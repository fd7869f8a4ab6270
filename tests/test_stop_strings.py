"""Decoda's HF stop-string matcher decides exactly as transformers' ``StopStringCriteria`` does."""

from __future__ import annotations

import random

import torch
from transformers.generation.stopping_criteria import StopStringCriteria

from decoding.text.stop import StopStrings

STOPS = [" 7", "END", "ab", "\n\n", "é!", ".", "the cat"]


def test_same_decision_as_stop_string_criteria_on_random_token_tails(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    # tokens whose text overlaps the stop strings, so matches (and near misses) are frequent
    pool = sorted({t for text in ["1, 7 77 END ENDING abab a b\n\n\n é! é .. the cat", "x the cats"] + STOPS
                   for t in tokenizer.encode(text)})  # fmt: skip
    rng = random.Random(0)
    hits = 0
    for k in range(1, len(STOPS) + 1, 2):
        strings = STOPS[:k]
        ours = StopStrings(tokenizer, strings)
        theirs = StopStringCriteria(tokenizer, strings)
        for _ in range(400):
            ids = [rng.choice(pool) for _ in range(rng.randrange(1, 12))]
            expected = bool(theirs(torch.tensor([ids]), None)[0])
            got = ours.completed_by(ids)
            assert (got is not None) == expected, (strings, ids, tokenizer.decode(ids))
            hits += expected
    assert hits > 100  # the sample exercised matches, not only misses


def test_names_the_stop_string_and_needs_the_final_token(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    ours = StopStrings(tokenizer, ["zzq", " 7"])
    ids = tokenizer.encode("1, 2, 7")
    assert ours.completed_by(ids) == " 7"
    assert ours.completed_by(ids + tokenizer.encode(" 8")) is None  # completed earlier, not by this token
