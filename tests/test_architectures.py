"""Issue 23's matrix: every decoder-only family of ``tests/arch_families.py``, served token-exact.

For each family, a tiny random model (seeded) runs through the engine, and at batch size 1 every
strategy gives the reference's tokens: transformers 5's ``generate()`` for greedy, seeded sampling,
beam search, prompt lookup and early exit; for contrastive search and DoLa (gone from transformers
5) the 4.x algorithms recomputed from full forwards (``tests/reference_decoding.py``). Then all of
them run at once in one batch and must not change; the prefix cache, int8/int4 weights and compiled
layers must not change them either. Families Decoda cannot serve are refused at load with a reason.
The README's architecture table is written from this matrix (``tests/write_arch_table.py``).
"""

from __future__ import annotations

import copy
import functools
import os
import random
from pathlib import Path

import pytest
import torch

from decoding.model.attention import register_attention
from decoding.model.compile import compile_model
from decoding.model.loading import load_model
from decoding.model.registry import ModelLoadError
from decoding.params import GenerationParams
from tests import reference_decoding
from tests.arch_families import EOS, FAMILIES, REFUSED, VOCAB, Family
from tests.engine_harness import EngineHarness, as_served
from tests.near_tie import assert_equal_until_a_near_tie, near_ties

SERVED = [family for family in FAMILIES if family.refused is None]
NEW_TOKENS = 10


def family_id(family: Family) -> str:
    return family.model_type


@functools.cache
def model_of(model_type: str) -> torch.nn.Module:
    return next(f for f in FAMILIES if f.model_type == model_type).build(seed=0)


@functools.cache
def served_of(model_type: str) -> torch.nn.Module:
    """One copy as the server runs it per family, shared by the engines of the tests (packing is slow)."""
    return as_served(model_of(model_type))


def prompt(index: int) -> list[int]:
    """Prompts longer than the families' sliding windows; the second repeats itself (prompt lookup drafts)."""
    rng = random.Random(index)
    base = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(7, 12))]
    return base + base[:6] if index % 2 else base


def hf_generate(model: torch.nn.Module, ids: list[int], seed: int | None = None, **kwargs: object) -> list[int]:
    if seed is not None:
        torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            eos_token_id=EOS,
            pad_token_id=0,
            top_k=0,
            **kwargs,
        )
    tokens = out[0, len(ids) :].tolist()
    return tokens[: tokens.index(EOS) + 1] if EOS in tokens else tokens  # HF pads after eos; ours ends


# strategy -> (engine parameters, how to get the expected tokens for one prompt)
STRATEGIES: dict[str, tuple[dict, object]] = {
    "greedy": (dict(), lambda m, p: hf_generate(m, p, max_new_tokens=NEW_TOKENS, do_sample=False)),
    "sampling": (
        dict(do_sample=True, temperature=0.8, seed=7),
        lambda m, p: hf_generate(m, p, seed=7, max_new_tokens=NEW_TOKENS, do_sample=True, temperature=0.8),
    ),
    "beam": (dict(num_beams=3), lambda m, p: hf_generate(m, p, max_new_tokens=NEW_TOKENS, num_beams=3)),
    "contrastive": (
        dict(penalty_alpha=0.6, top_k=4),
        lambda m, p: reference_decoding.contrastive_search(m, p, 4, 0.6, NEW_TOKENS, EOS),
    ),
    "dola": (dict(dola_layers=[0, 1]), lambda m, p: reference_decoding.dola(m, p, [0, 1], NEW_TOKENS, EOS)),
    "prompt_lookup": (
        dict(prompt_lookup_num_tokens=3),
        lambda m, p: hf_generate(m, p, max_new_tokens=NEW_TOKENS, do_sample=False, prompt_lookup_num_tokens=3),
    ),
    "early_exit": (dict(assistant_early_exit=1), lambda m, p: hf_early_exit(m, p)),
}
# transformers' early exit lowers config.num_hidden_layers while drafting. These families' forward
# loops ignore that field, so its cache has fewer layers than they run (IndexError), or their config
# checks it against layer_types (ValueError). Early exit is assisted greedy, whose tokens are greedy's
# by definition: that is the reference for them.
HF_EARLY_EXIT_BREAKS = {"stablelm", "gpt_neox", "gpt2", "gpt_oss", "cohere2", "exaone4"}


def hf_early_exit(model: torch.nn.Module, ids: list[int]) -> list[int]:
    if model.config.model_type in HF_EARLY_EXIT_BREAKS:
        return hf_generate(model, ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    # a copy: a failing early exit would leave the shared model's config at one layer
    return hf_generate(copy.deepcopy(model), ids, max_new_tokens=NEW_TOKENS, do_sample=False, assistant_early_exit=1)


PROMPTS = (0, 1)


def params(strategy: str) -> GenerationParams:
    return GenerationParams(max_new_tokens=NEW_TOKENS, **STRATEGIES[strategy][0])


@functools.cache
def expected(model_type: str, strategy: str, index: int) -> tuple[int, ...]:
    return tuple(STRATEGIES[strategy][1](model_of(model_type), prompt(index)))


def run_alone(model: torch.nn.Module, tokenizer, strategy: str, index: int, served: bool = False) -> list[int]:
    harness = EngineHarness(model, tokenizer, [EOS], served=served)
    harness.add("r", prompt(index), params(strategy))
    harness.run()
    return harness.token_ids("r")


def strategies_of(family: Family) -> list[str]:
    return [name for name in STRATEGIES if name not in family.skip]


@pytest.mark.parametrize("family", SERVED, ids=family_id)
def test_every_strategy_alone_equals_the_reference(family, smollm2_tokenizer):
    assert len({t for i in PROMPTS for t in expected(family.model_type, "greedy", i)}) >= 6, "degenerate model"
    for strategy in strategies_of(family):  # one prompt alone (the mixed batch runs both)
        got = run_alone(served_of(family.model_type), smollm2_tokenizer, strategy, 1, served=True)
        assert got == list(expected(family.model_type, strategy, 1)), strategy


@pytest.mark.parametrize("family", SERVED, ids=family_id)
def test_every_strategy_in_one_mixed_batch_and_from_the_prefix_cache(family, smollm2_tokenizer):
    """All strategies and prompts at once (chunked prefill beside decode rows), twice: the second
    round's prompts come from the prefix cache. Nothing changes."""
    served = served_of(family.model_type)
    harness = EngineHarness(served, smollm2_tokenizer, [EOS], max_num_batched_tokens=16, block_size=4, served=True)
    cases = [(strategy, index) for strategy in strategies_of(family) for index in PROMPTS]
    for round_ in ("cold", "warm"):
        for strategy, index in cases:
            harness.add(f"{round_}-{strategy}-{index}", prompt(index), params(strategy))
        harness.run()
    for round_ in ("cold", "warm"):
        for strategy, index in cases:
            got = harness.token_ids(f"{round_}-{strategy}-{index}")
            assert got == list(expected(family.model_type, strategy, index)), f"{round_} {strategy}, prompt {index}"
    assert max(harness.outputs[f"warm-greedy-{i}"][-1].num_cached_tokens for i in PROMPTS) > 0


@pytest.fixture(scope="module")
def folders(tmp_path_factory, smollm2_tokenizer):
    """Each family saved as a model folder (its seeded weights and the reused tokenizer), once."""
    saved: dict[str, Path] = {}

    def folder(model_type: str) -> Path:
        if model_type not in saved:
            saved[model_type] = tmp_path_factory.mktemp(model_type)
            model_of(model_type).save_pretrained(saved[model_type])
            smollm2_tokenizer.save_pretrained(saved[model_type])
        return saved[model_type]

    return folder


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("family", SERVED, ids=family_id)
def test_loads_from_a_folder_and_low_bit_weights_equal_hf_on_the_same_weights(family, mode, folders):
    """``load_model`` accepts the family (its paged logits pass the load-time check against eager
    attention) with int8 and int4 weights, and greedy equals transformers on those weights."""
    loaded = load_model(str(folders(family.model_type)), attn_implementation=register_attention(), quantization=mode)
    reference = copy.deepcopy(loaded.model)
    reference.set_attn_implementation("eager")
    want = hf_generate(reference, prompt(1), max_new_tokens=NEW_TOKENS, do_sample=False)
    ties = near_ties(reference, prompt(1), want)
    harness = EngineHarness(loaded.model, loaded.tokenizer, [EOS], served=True)
    harness.add("r", prompt(1), params("greedy"))
    harness.run()
    if mode == "int4":  # the 4-bit kernel quantizes activations: equal up to a near tie (tests/near_tie.py)
        assert_equal_until_a_near_tie(harness.token_ids("r"), want, ties)
    else:
        assert harness.token_ids("r") == want


# one family for each way the compiled attention call differs (soft-capping, sinks, MLA's narrower
# values) and GPT-2 (its layers named otherwise); compiled, every family's layout travels beside the call.
# DECODA_ARCH_COMPILE_ALL=1 compiles every served family (about a minute more on 2 cores).
COMPILED_BY_DEFAULT = ["gemma2", "gpt_oss", "deepseek_v3", "gpt2"]
COMPILED = COMPILED_BY_DEFAULT
if os.environ.get("DECODA_ARCH_COMPILE_ALL"):
    COMPILED = [family.model_type for family in SERVED]


@pytest.mark.parametrize("model_type", COMPILED)
def test_compiled_layers_keep_the_tokens(model_type, smollm2_tokenizer):
    """``--compile`` traces the whole forward, each layer a nested region, with the family's attention
    extras (the custom op carries soft-cap and sinks); dynamo's eager backend keeps this fast on 2 cores."""
    torch._dynamo.reset()
    compiled = copy.deepcopy(model_of(model_type))
    compiled.set_attn_implementation(register_attention())
    compile_model(compiled, backend="eager")
    harness = EngineHarness(compiled, smollm2_tokenizer, [EOS], served=True)
    cases = [(strategy, index) for strategy in ("greedy", "contrastive") for index in PROMPTS]
    for strategy, index in cases:
        harness.add(f"{strategy}-{index}", prompt(index), params(strategy))
    harness.run()
    torch._dynamo.reset()
    for strategy, index in cases:
        assert harness.token_ids(f"{strategy}-{index}") == list(expected(model_type, strategy, index)), strategy


@pytest.mark.parametrize("family", REFUSED, ids=family_id)
def test_a_family_decoda_cannot_serve_is_refused_at_load_with_its_reason(family, smollm2_tokenizer, tmp_path):
    family.save(tmp_path)
    smollm2_tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError) as refused:
        load_model(str(tmp_path), attn_implementation=register_attention())
    message = str(refused.value)
    assert family.model_type in message and family.refused in message


def test_the_readme_table_is_the_matrix():
    from tests.write_arch_table import README, readme_table, render

    assert readme_table(README.read_text()) == render(), "run: .venv/bin/python -m tests.write_arch_table"


@pytest.mark.parametrize(
    ("value_dim", "softcap", "sinks"),
    [(16, 0.0, None), (16, 5.0, None), (16, 0.0, torch.ones(4)), (8, 0.0, None)],
    ids=["plain", "softcap", "sinks", "mla"],
)
def test_the_compiled_attention_op_returns_the_layout_its_fake_promises(value_dim, softcap, sinks):
    """Inductor asserts a custom op's output strides against its fake: every path must be contiguous
    (the soft-cap, sink and MLA path once returned a transposed view, and compiled Gemma 2 failed)."""
    from decoding.kv.pool import KVPool
    from decoding.model.attention import Segment, StepLayout, _packed_attention_shape, active_layout, packed_attention

    pool = KVPool(num_layers=1, num_blocks=8, num_kv_heads=2, head_dim=16, value_head_dim=value_dim,
                  max_model_len=32, dtype=torch.float32, device="cpu", num_slots=2)  # fmt: skip
    segments = [Segment(1, 0, 5)]  # a prompt chunk alone: its attention output is the op's output
    pool.prepare(1, 0, 5)
    pool.keys[0].zero_()
    pool.values[0].zero_()
    layout = StepLayout(pool, segments, torch.device("cpu"))
    query, key, value = torch.randn(1, 4, 5, 16), torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, value_dim)
    with active_layout(layout):
        out = packed_attention(query, key, value, torch.tensor(0), 0.25, -1, softcap, sinks)
    fake = _packed_attention_shape(query, key, value, torch.tensor(0), 0.25, -1, softcap, sinks)
    assert out.shape == fake.shape and out.stride() == fake.stride()
