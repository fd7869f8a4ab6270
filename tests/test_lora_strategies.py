"""LoRA adapters under every strategy, each against a reference that knows nothing of the engine: beam search
and watermarking against ``PeftModel.generate()``, contrastive search and DoLa against 4.x's step math run on
the ``PeftModel`` (transformers 5 dropped both), the lossless ones (prompt lookup, early exit, an assistant
model) against the adapter's plain greedy ``generate()``, and structured outputs against ``generate()`` with
the same grammar mask. An assistant drafts without the adapter: only the target runs it."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from decoding.engine.core import Engine
from decoding.engine.limits import EngineLimits
from decoding.engine.lora import LoraLimits
from decoding.model.lora import lora_of
from decoding.params import GenerationParams
from decoding.params.structured import StructuredOutput
from decoding.params.watermarking import WatermarkingConfig
from decoding.structured.compiler import GrammarCompiler
from tests.engine_harness import EngineHarness, as_served, tiny_llama
from tests.reference_decoding import contrastive_search, dola
from tests.structured_schemas import SCHEMAS
from tests.test_engine_beam import hf_beam
from tests.test_lora_engine import EOS, GREEDY, LoraHarness, make_adapter, prompt, reference
from tests.test_structured_engine import VOCAB, constrained, hf_constrained_greedy
from tests.test_watermark import hf_generate as hf_watermarked


@pytest.fixture(scope="module")
def base():
    return tiny_llama(500, seed=7)


@pytest.fixture(scope="module")
def adapter(base, tmp_path_factory):
    folder = tmp_path_factory.mktemp("lora-strategies") / "a"
    return folder, make_adapter(base, folder, seed=1, r=8, alpha=16)


def drafted(harness: EngineHarness, request_id: str) -> tuple[int, int]:
    """(draft tokens proposed, draft tokens the target kept) over the request."""
    last = harness.outputs[request_id][-1]
    return last.num_draft_tokens, last.num_accepted_draft_tokens


def run_alone(base, tokenizer, folder, ids: list[int], params: GenerationParams) -> EngineHarness:
    """One request with the adapter, at batch 1."""
    harness = LoraHarness(base, tokenizer, {"a": folder})
    harness.add("r", ids, params.replace(lora_name="a"))
    harness.run()
    return harness


@pytest.mark.parametrize(
    "knobs",
    [dict(num_beams=3, max_new_tokens=10), dict(num_beams=4, max_new_tokens=8, num_return_sequences=2),
     dict(num_beams=3, do_sample=True, max_new_tokens=8, top_k=20)],
    ids=["beam", "beam-n2", "beam-sampling"],
)  # fmt: skip
def test_beam_search_with_an_adapter_equals_peft_generate(base, adapter, smollm2_tokenizer, knobs):
    folder, peft_model = adapter
    n = knobs.get("num_return_sequences", 1)
    for p in range(2):
        ids = prompt(30 + p)
        seed = 100 + p if knobs.get("do_sample") else None
        params = GenerationParams(**knobs, n=n, logprobs=0, seed=seed)
        harness = run_alone(base, smollm2_tokenizer, folder, ids, params)
        sequences, scores = hf_beam(peft_model, ids, seed=seed, **knobs)
        assert [harness.token_ids("r", i) for i in range(n)] == sequences, f"prompt {p}"
        assert harness.sequence_scores("r") == pytest.approx(scores, abs=1e-4)
        plain_sequences, _ = hf_beam(base, ids, seed=seed, **knobs)
        assert plain_sequences != sequences  # the adapter changes the beams


def test_contrastive_search_and_dola_with_an_adapter_equal_the_reference_on_peft(base, adapter, smollm2_tokenizer):
    folder, peft_model = adapter
    for p in range(2):
        ids = prompt(40 + p)
        params = GenerationParams(max_new_tokens=10, penalty_alpha=0.6, top_k=4)
        ours = run_alone(base, smollm2_tokenizer, folder, ids, params)
        expected = contrastive_search(peft_model, ids, top_k=4, penalty_alpha=0.6, max_new_tokens=10, eos=EOS)
        assert ours.token_ids("r") == expected, f"contrastive prompt {p}"
        assert expected != contrastive_search(base, ids, top_k=4, penalty_alpha=0.6, max_new_tokens=10, eos=EOS)
        for layers in ("high", "low"):
            dola_params = GenerationParams(max_new_tokens=10, dola_layers=layers)
            ours = run_alone(base, smollm2_tokenizer, folder, ids, dola_params)
            expected = dola(peft_model, ids, layers, max_new_tokens=10, eos=EOS)
            assert ours.token_ids("r") == expected, f"dola {layers} prompt {p}"


@pytest.mark.parametrize(
    "knobs",
    [dict(prompt_lookup_num_tokens=3), dict(prompt_lookup_num_tokens=2, max_matching_ngram_size=1),
     dict(assistant_early_exit=1)],
    ids=["prompt-lookup", "prompt-lookup-ngram1", "early-exit"],
)  # fmt: skip
def test_lossless_drafting_with_an_adapter_equals_its_plain_greedy(base, adapter, smollm2_tokenizer, knobs):
    """Drafts the prompt proposes (a prompt that repeats itself, so they are accepted) or the adapter's first
    layer proposes are verified by the target with the adapter: the adapter's greedy tokens, PEFT's."""
    folder, peft_model = adapter
    for p in range(2):
        ids = prompt(50 + p, 6) * 3
        ours = run_alone(base, smollm2_tokenizer, folder, ids, GREEDY.replace(**knobs))
        assert ours.token_ids("r") == reference(peft_model, ids, GREEDY), f"prompt {p}"
        assert ours.token_ids("r") != reference(base, ids, GREEDY)  # the adapter's tokens, not the base's
        assert drafted(ours, "r")[0] > 0  # the drafts ran


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_watermark_with_an_adapter_equals_peft_generate(base, adapter, smollm2_tokenizer, sampled):
    folder, peft_model = adapter
    config = WatermarkingConfig(bias=2.5, context_width=2)
    knobs = dict(do_sample=True, temperature=0.8, top_k=40) if sampled else {}
    for p in range(2):
        ids = prompt(60 + p)
        params = GenerationParams(max_new_tokens=12, watermarking_config=config, seed=70 + p, **knobs)
        ours = run_alone(base, smollm2_tokenizer, folder, ids, params)
        expected = hf_watermarked(peft_model, ids, config, seed=70 + p, max_new_tokens=12, **knobs)
        assert ours.token_ids("r") == expected, f"prompt {p}"
        assert expected != hf_watermarked(base, ids, config, seed=70 + p, max_new_tokens=12, **knobs)


# ---- an assistant model: the target runs the adapter, the assistant does not -------------------------------
def test_an_assistant_drafts_without_the_adapter_and_the_target_keeps_peft_greedy(base, adapter, smollm2_tokenizer):
    """The assistant is the base model itself: the base's rows keep every draft, the adapter's rows reject the
    drafts where the adapter disagrees with the base (an assistant running the adapter would have them all
    kept), and every row's tokens are its model's greedy ``generate()``: speculation is lossless."""
    folder, peft_model = adapter
    assistant = as_served(base)  # the base itself: its drafts are what the target runs without the adapter
    harness = LoraHarness(base, smollm2_tokenizer, {})
    harness.engine = Engine(as_served(base), smollm2_tokenizer, [EOS], EngineLimits(256, 32, 512), harness._collect,
                            torch.device("cpu"), assistants={"small": assistant},
                            lora=LoraLimits(4, 16))  # fmt: skip
    harness.engine.loras.load("a", str(folder))
    assert not any(lora_of(module) for module in assistant.modules())  # only the target is wrapped
    assisted = GREEDY.replace(assistant_model="small")
    cases = {}
    for p in range(3):
        ids = prompt(80 + p)
        cases[f"a{p}"] = (ids, assisted.replace(lora_name="a"), peft_model)
        cases[f"base{p}"] = (ids, assisted, base)  # the base beside it, in the same batch
    for request_id, (ids, params, _) in cases.items():
        harness.add(request_id, ids, params)
    harness.run()
    for request_id, (ids, _, model) in cases.items():
        assert harness.token_ids(request_id) == reference(model, ids, GREEDY), request_id
    assert harness.token_ids("a0") != harness.token_ids("base0")
    for p in range(3):  # the base's rows keep every draft; the adapter's only the drafts the adapter agrees with
        assert drafted(harness, f"base{p}")[0] == drafted(harness, f"base{p}")[1] > 0
        assert drafted(harness, f"a{p}")[1] < drafted(harness, f"a{p}")[0]


# ---- structured outputs ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wide():
    """A model with the tokenizer's whole vocabulary (the grammar reads token texts) and an adapter on it."""
    return tiny_llama(VOCAB, seed=5, num_layers=2)


@pytest.fixture(scope="module")
def compiler(smollm2_tokenizer):
    return GrammarCompiler(smollm2_tokenizer, VOCAB, [EOS])


def test_a_schema_with_an_adapter_is_obeyed_and_equals_peft_under_the_same_mask(wide, smollm2_tokenizer, compiler,
                                                                                 tmp_path):  # fmt: skip
    peft_model = make_adapter(wide, tmp_path / "wide", seed=3, r=8, alpha=16, b_std=0.5)
    harness = LoraHarness(wide, smollm2_tokenizer, {"w": tmp_path / "wide"})
    requests = {}
    for i, schema in enumerate(SCHEMAS[:4]):
        spec = StructuredOutput("json", schema, param="response_format")
        ids = [100 + (i * 977 + k * 131) % (VOCAB - 200) for k in range(8)]
        requests[f"w{i}"] = (ids, spec, constrained(compiler, spec, max_new_tokens=120, lora_name="w"))
        requests[f"base{i}"] = (ids, spec, constrained(compiler, spec, max_new_tokens=120))
    for request_id, (ids, _, params) in requests.items():
        harness.add(request_id, ids, params)
    harness.run()
    differs = 0
    for request_id, (ids, spec, params) in requests.items():
        model = peft_model if params.lora_name else wide
        expected = hf_constrained_greedy(model, compiler, spec, ids, 120)
        assert harness.finish_reason(request_id) == "stop", f"{request_id}: {harness.text(request_id)!r}"
        assert expected[-1] == EOS  # the grammar was complete: HF needs one more step for eos
        assert harness.token_ids(request_id) == expected[:-1], request_id
        jsonschema.validate(json.loads(harness.text(request_id)), spec.value)
        if params.lora_name:
            differs += harness.token_ids(request_id) != harness.token_ids(request_id.replace("w", "base"))
    assert differs  # the adapter changes what the schema lets through
