"""``--fair-share steps`` (decoding/engine/step_shares.py): while several callers run, each step feeds each
caller its weight's part of the rows the least-holding caller feeds; within a caller the requests fed
least recently go first. Requests that sit a step out keep their state: every one still produces the
tokens of ``generate()`` (greedy) or of the same seeded request run alone (sampled).

On the previous main every running request fed every step whatever its caller: a caller with 2 rows
beside another's 6 ran at the pace of an 8-row step.
"""

from __future__ import annotations

import random

import pytest
import torch

from decoding.params import GenerationParams
from server.config.settings import Settings
from tests.engine_harness import EngineHarness, hf_greedy, tiny_llama

EOS = 2
VOCAB = 49152
TOKENS = 8


@pytest.fixture(scope="module")
def model(smollm2_tokenizer):
    return tiny_llama(len(smollm2_tokenizer), seed=5)


def prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(10 + seed % 7)]


def greedy(caller: str) -> GenerationParams:
    return GenerationParams(max_new_tokens=TOKENS, ignore_eos=True, caller=caller)


SAMPLED = GenerationParams(max_new_tokens=TOKENS, ignore_eos=True, do_sample=True, temperature=1.2, top_k=40, seed=9,
                           caller="key:big")  # fmt: skip


def progress(harness: EngineHarness, ids: list[str]) -> dict[str, int]:
    return {rid: len(harness.token_ids(rid)) if rid in harness.outputs else 0 for rid in ids}


def run_two_callers(model, tokenizer, weights: dict[str, float]) -> tuple[EngineHarness, list[dict[str, int]]]:  # noqa: ANN001
    """Six requests of ``key:big`` (one sampled) and two of ``key:small``; each step's token counts."""
    harness = EngineHarness(model, tokenizer, [EOS], max_num_seqs=16, max_model_len=128, fair_share="steps",
                            caller_weights=weights)  # fmt: skip
    for i in range(5):
        harness.add(f"big{i}", prompt(i), greedy("key:big"))
    harness.add("big5", prompt(5), SAMPLED)
    for i in range(2):
        harness.add(f"small{i}", prompt(10 + i), greedy("key:small"))
    ids = [*(f"big{i}" for i in range(6)), "small0", "small1"]
    counts = []
    with torch.inference_mode():
        while harness.engine.has_work():
            harness.engine.step()
            counts.append(progress(harness, ids))
    return harness, counts


def check_tokens(model, tokenizer, harness: EngineHarness) -> None:  # noqa: ANN001
    for i in [0, 1, 2, 3, 4]:
        assert harness.token_ids(f"big{i}") == hf_greedy(model, prompt(i), TOKENS), f"big{i}"
    for i in range(2):
        assert harness.token_ids(f"small{i}") == hf_greedy(model, prompt(10 + i), TOKENS), f"small{i}"
    alone = EngineHarness(model, tokenizer, [EOS], max_num_seqs=4, max_model_len=128)
    alone.add("big5", prompt(5), SAMPLED)
    alone.run()
    assert harness.token_ids("big5") == alone.token_ids("big5")


@pytest.mark.parametrize(("big_weight", "big_per_step"), [(1.0, 2), (2.0, 4)])
def test_each_step_feeds_each_caller_its_part_and_every_request_keeps_its_tokens(model, smollm2_tokenizer,
                                                                                big_weight, big_per_step):  # fmt: skip
    harness, counts = run_two_callers(model, smollm2_tokenizer, {"key:big": big_weight})
    small_done = next(n for n, count in enumerate(counts) if count["small0"] == TOKENS)
    for before, after in zip(counts[:small_done], counts[1 : small_done + 1], strict=True):
        fed = {rid for rid in after if after[rid] > before[rid]}
        assert {"small0", "small1"} <= fed  # the small caller feeds every step
        assert len(fed - {"small0", "small1"}) == big_per_step  # the big one its part, in turn
    # the big caller's requests take turns: none is more than one turn ahead of another
    middle = counts[small_done // 2]
    assert max(middle[f"big{i}"] for i in range(6)) - min(middle[f"big{i}"] for i in range(6)) <= 1
    # once the small caller is gone, the big one feeds every row again
    last = counts[small_done + 1 :]
    for before, after in zip(last, last[1:], strict=False):
        assert all(after[f"big{i}"] - before[f"big{i}"] == 1 for i in range(6) if before[f"big{i}"] < TOKENS)
    check_tokens(model, smollm2_tokenizer, harness)
    assert harness.engine.pool.blocks.num_used == 0


def test_one_caller_feeds_every_request_every_step(model, smollm2_tokenizer):
    harness = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_seqs=16, max_model_len=128, fair_share="steps")
    for i in range(4):
        harness.add(f"r{i}", prompt(i), greedy("key:only"))
    with torch.inference_mode():
        harness.engine.step()  # the prompts
        harness.engine.step()
    assert progress(harness, [f"r{i}" for i in range(4)]) == {f"r{i}": 2 for i in range(4)}


def test_rows_the_default_feeds_every_caller_every_step(model, smollm2_tokenizer):
    harness = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_seqs=16, max_model_len=128)
    for i in range(3):
        harness.add(f"big{i}", prompt(i), greedy("key:big"))
    harness.add("small", prompt(10), greedy("key:small"))
    with torch.inference_mode():
        harness.engine.step()
        harness.engine.step()
    assert set(progress(harness, ["big0", "big1", "big2", "small"]).values()) == {2}


def test_an_unknown_mode_fails_at_start_naming_the_setting():
    with pytest.raises(ValueError, match="fair_share must be one of rows, steps"):
        Settings(fair_share="time").check()
