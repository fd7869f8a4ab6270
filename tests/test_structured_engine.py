"""Structured outputs hold under every strategy the engine serves: the grammar's mask sits in the
sample path, each row (beam, candidate row, verified draft) advancing its own matcher."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch

from decoding.params import GenerationParams, ParameterError, validate
from decoding.params.structured import StructuredOutput
from decoding.structured.compiler import GrammarCompiler
from tests.engine_harness import EngineHarness, tiny_llama
from tests.structured_schemas import SCHEMAS

EOS = 2  # SmolLM2's <|im_end|>: the tokenizer's eos, which the grammar allows once it is complete
VOCAB = 49152  # the tokenizer's: the grammar reads token texts
ALLOW_ALL = f"start: <[0-{VOCAB - 1}]>*"  # llguidance's token-range syntax: every token, any number of times


@pytest.fixture(scope="module")
def model():
    return tiny_llama(VOCAB, seed=5, num_layers=2)


@pytest.fixture(scope="module")
def compiler(smollm2_tokenizer):
    return GrammarCompiler(smollm2_tokenizer, VOCAB, [EOS])


def constrained(compiler: GrammarCompiler, spec: StructuredOutput, **knobs: object) -> GenerationParams:
    params = GenerationParams(structured_output=spec, **knobs)
    validate(params)
    compiled, _ = compiler.compile(spec)
    return params.replace(compiled_grammar=compiled)


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, VOCAB) for _ in range(rng.randrange(3, 12))] for _ in range(count)]


def hf_constrained_greedy(model, compiler: GrammarCompiler, spec: StructuredOutput, prompt: list[int], n: int):
    """HF's own constrained decoding: ``prefix_allowed_tokens_fn`` answering from a fresh matcher."""
    matcher = compiler.compile(spec)[0].new_matcher()
    fed = [0]

    def allowed(_batch_id: int, input_ids: torch.Tensor) -> list[int]:
        generated = input_ids.tolist()[len(prompt) :]
        for token in generated[fed[0] :]:
            assert matcher.consume_token(token)
        fed[0] = len(generated)
        words = torch.zeros((VOCAB + 31) // 32, dtype=torch.int32)
        matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * 4)
        bits = ((words[:, None] >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[:VOCAB]
        return bits.nonzero().flatten().tolist()

    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), max_new_tokens=n,
            do_sample=False, eos_token_id=EOS, pad_token_id=0, prefix_allowed_tokens_fn=allowed,
        )  # fmt: skip
    return out[0, len(prompt) :].tolist()


def run(model, tokenizer, requests: dict[str, tuple[list[int], GenerationParams]], **limits) -> EngineHarness:
    harness = EngineHarness(model, tokenizer, [EOS], **limits)
    for name, (prompt, params) in requests.items():
        harness.add(name, prompt, params)
    harness.run()
    return harness


@pytest.mark.parametrize(
    "spec",
    [
        StructuredOutput("json", SCHEMAS[0]),
        StructuredOutput("json", SCHEMAS[12]),
        StructuredOutput("regex", r"[0-9]{3}-[a-z]{2,4}"),
        StructuredOutput("choice", ["alpha", "beta", "gamma delta"]),
    ],
    ids=["object", "nested-array", "regex", "choice"],
)
def test_greedy_under_a_constraint_equals_hf_with_the_same_mask(model, smollm2_tokenizer, compiler, spec):
    for prompt in prompts(3, seed=1):
        params = constrained(compiler, spec, max_new_tokens=60)
        harness = run(model, smollm2_tokenizer, {"r": (prompt, params)})
        expected = hf_constrained_greedy(model, compiler, spec, prompt, 60)
        if expected and expected[-1] == EOS:  # the grammar was complete: HF needs one more step for eos
            expected = expected[:-1]
            assert harness.finish_reason("r") == "stop"
        assert harness.token_ids("r") == expected


STRATEGIES = {
    "greedy": dict(),
    "sampling": dict(do_sample=True, seed=7, top_k=20, temperature=0.9),
    "beam": dict(num_beams=4),
    "beam_sampling": dict(num_beams=3, do_sample=True, seed=3),
    "group_beam": dict(num_beams=4, num_beam_groups=2, diversity_penalty=0.5),
    "contrastive": dict(penalty_alpha=0.6, top_k=4),
    "dola": dict(dola_layers="low", repetition_penalty=1.2),
    "prompt_lookup": dict(prompt_lookup_num_tokens=3),
    "early_exit": dict(assistant_early_exit=1),
    "guidance": dict(guidance_scale=1.5),
    "watermark": dict(do_sample=True, seed=11, watermarking_config=None),
}


def strategy_knobs(name: str) -> dict:
    knobs = dict(STRATEGIES[name])
    if name == "watermark":
        from decoding.params.watermarking import WatermarkingConfig

        knobs["watermarking_config"] = WatermarkingConfig(bias=2.0)
    return knobs


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_a_constraint_that_allows_every_token_changes_nothing(model, smollm2_tokenizer, compiler, name):
    spec = StructuredOutput("grammar", ALLOW_ALL)
    for prompt in prompts(2, seed=2):
        knobs = strategy_knobs(name)
        plain = run(model, smollm2_tokenizer, {"r": (prompt, GenerationParams(max_new_tokens=12, **knobs))})
        ours = run(model, smollm2_tokenizer, {"r": (prompt, constrained(compiler, spec, max_new_tokens=12, **knobs))})
        assert ours.token_ids("r") == plain.token_ids("r")


def test_fifty_schemas_under_every_strategy_in_one_batch_all_parse_and_validate(model, smollm2_tokenizer, compiler):
    """Greedy, seeded sampling, beam search (4), contrastive search and prompt lookup, all 250
    requests in one engine: every output is JSON that its schema accepts."""
    chosen = ["greedy", "sampling", "beam", "contrastive", "prompt_lookup"]
    requests = {}
    for i, schema in enumerate(SCHEMAS):
        for name in chosen:
            spec = StructuredOutput("json", schema, param="response_format")
            knobs = {**strategy_knobs(name), **({"seed": 100 + i} if name == "sampling" else {})}
            requests[f"{name}-{i}"] = (prompts(1, seed=i)[0], constrained(compiler, spec, max_new_tokens=160, **knobs))
    harness = run(model, smollm2_tokenizer, requests, max_num_seqs=512, max_num_batched_tokens=4096, max_model_len=256)
    for key, (_, params) in requests.items():
        text = harness.text(key)
        assert harness.finish_reason(key) == "stop", f"{key}: {text!r}"
        jsonschema.validate(json.loads(text), params.structured_output.value)


@pytest.mark.parametrize("name", ["dola", "group_beam", "beam_sampling", "early_exit", "guidance", "watermark"])
def test_every_other_strategy_keeps_the_schema(model, smollm2_tokenizer, compiler, name):
    requests = {}
    for i, schema in enumerate(SCHEMAS[:12]):
        spec = StructuredOutput("json", schema, param="response_format")
        params = constrained(compiler, spec, max_new_tokens=160, **strategy_knobs(name))
        requests[str(i)] = (prompts(1, seed=50 + i)[0], params)
    harness = run(model, smollm2_tokenizer, requests, max_num_seqs=128)
    for key, (_, params) in requests.items():
        assert harness.finish_reason(key) == "stop", f"{name} {key}: {harness.text(key)!r}"
        jsonschema.validate(json.loads(harness.text(key)), params.structured_output.value)


def test_n_rows_and_beams_each_keep_their_own_matcher(model, smollm2_tokenizer, compiler):
    spec = StructuredOutput("choice", ["north", "south", "east", "west"])
    params = constrained(compiler, spec, max_new_tokens=10, n=4, num_beams=4, num_return_sequences=4)
    harness = run(model, smollm2_tokenizer, {"r": ([500, 600, 700], params)})
    for index in range(4):
        assert harness.text("r", index) in spec.value


def test_a_complete_grammar_stops_and_a_short_budget_cuts_with_length(model, smollm2_tokenizer, compiler):
    spec = StructuredOutput("regex", r"[0-9]{40}")
    done = run(model, smollm2_tokenizer, {"r": ([500, 600], constrained(compiler, spec, max_new_tokens=80))})
    assert done.finish_reason("r") == "stop" and len(done.text("r")) == 40
    cut = run(model, smollm2_tokenizer, {"r": ([500, 600], constrained(compiler, spec, max_new_tokens=3))})
    assert cut.finish_reason("r") == "length" and len(cut.token_ids("r")) == 3


def test_the_compiler_caches_and_names_the_field_of_a_bad_constraint(compiler):
    spec = StructuredOutput("json", {"type": "object", "properties": {"k": {"type": "integer"}}}, "response_format")
    first, cached = compiler.compile(spec)
    again, cached_again = compiler.compile(StructuredOutput("json", dict(spec.value), "response_format"))
    assert not cached and cached_again and again is first
    bad = [
        StructuredOutput("json", {"type": "strin"}, "response_format"),
        StructuredOutput("regex", "a(b", "structured_outputs"),
        StructuredOutput("grammar", "start: (", "structured_outputs"),
        StructuredOutput("json", {"type": "string", "format": "no-such-format"}, "response_format"),
    ]
    for spec in bad:
        with pytest.raises(ParameterError) as error:
            compiler.compile(spec)
        assert error.value.param == spec.param and spec.param in error.value.message


def test_gbnf_and_lark_grammars_both_compile(compiler):
    for text in ('root ::= "yes" | "no"', 'start: "yes" | "no"'):
        matcher = compiler.compile(StructuredOutput("grammar", text))[0].new_matcher()
        assert not matcher.is_error()


def test_request_checks_name_the_field():
    cases = [
        (GenerationParams(structured_output=StructuredOutput("choice", [], "structured_outputs")),
         "structured_outputs"),
        (GenerationParams(structured_output=StructuredOutput("json", "x" * 10, "response_format")), "response_format"),
        (GenerationParams(structured_output=StructuredOutput("regex", "a" * 70_000)), "structured_outputs"),
        (GenerationParams(structured_output=StructuredOutput("json", {}, "response_format"), custom_generate="echo"),
         "response_format"),
    ]  # fmt: skip
    for params, param in cases:
        with pytest.raises(ParameterError) as error:
            validate(params)
        assert error.value.param == param


def test_an_assistant_model_drafts_under_the_constraint(model, smollm2_tokenizer, compiler):
    """Drafts from a preloaded assistant (another model of the same vocabulary) are verified
    against the constrained target: assisted greedy equals constrained greedy, and sampled drafts
    (rejection sampling against the masked distribution) still give JSON the schema accepts."""
    from decoding.engine.core import Engine
    from tests.engine_harness import as_served

    assistant = tiny_llama(VOCAB, seed=99, num_layers=1)

    def with_assistant() -> EngineHarness:
        harness = EngineHarness(model, smollm2_tokenizer, [EOS], max_num_seqs=32)
        engine = harness.engine
        harness.engine = Engine(engine.runner.model, smollm2_tokenizer, [EOS], engine.limits, harness._collect,
                                torch.device("cpu"), assistants={"small": as_served(assistant)})  # fmt: skip
        return harness

    assisted, plain, requests = with_assistant(), {}, {}
    for i, schema in enumerate(SCHEMAS[:8]):
        spec = StructuredOutput("json", schema, param="response_format")
        prompt = prompts(1, seed=200 + i)[0]
        plain[str(i)] = (prompt, constrained(compiler, spec, max_new_tokens=120))
        requests[str(i)] = (prompt, constrained(compiler, spec, max_new_tokens=120, assistant_model="small"))
        requests[f"s{i}"] = (prompt, constrained(compiler, spec, max_new_tokens=120, assistant_model="small",
                                                 do_sample=True, seed=i))  # fmt: skip
    for name, (prompt, params) in requests.items():
        assisted.add(name, prompt, params)
    assisted.run()
    reference = run(model, smollm2_tokenizer, plain)
    for key in plain:
        assert assisted.token_ids(key) == reference.token_ids(key)
    for key, (_, params) in requests.items():
        assert assisted.finish_reason(key) == "stop", f"{key}: {assisted.text(key)!r}"
        jsonschema.validate(json.loads(assisted.text(key)), params.structured_output.value)


AMBIGUOUS = 'start: s\ns: s s | "a"\n'  # compiles in a millisecond; each mask grows with every token


def test_an_ambiguous_grammar_fails_its_own_request_and_no_other(model, smollm2_tokenizer, compiler):
    """The hostile request (n rows, forced long) ends with an error naming its constraint, counted;
    the requests beside it finish as they would alone. The per-call limit is lowered so the test's
    outcome does not depend on the machine's speed."""
    import decoding.sampling.grammar as grammar

    failures = []
    spec = StructuredOutput("grammar", AMBIGUOUS, param="structured_outputs")
    hostile = constrained(compiler, spec, max_new_tokens=400, min_new_tokens=400, n=4)
    schema = StructuredOutput("json", SCHEMAS[0], param="response_format")
    fine = constrained(compiler, schema, max_new_tokens=80)
    requests = {"hostile": ([500, 600], hostile), "fine": ([700, 800], fine),
                "plain": ([900, 901], GenerationParams(max_new_tokens=20))}  # fmt: skip
    alone = run(model, smollm2_tokenizer, {k: v for k, v in requests.items() if k != "hostile"})
    saved = grammar.MEAN_CALL_LIMIT_S
    grammar.MEAN_CALL_LIMIT_S = 1e-3  # 1 ms a call for its 4 rows: the ambiguous masks pass it within ~150 tokens
    try:
        harness = EngineHarness(model, smollm2_tokenizer, [EOS])
        harness.engine.observer.on_grammar_failed = failures.append
        for name, (prompt, params) in requests.items():
            harness.add(name, prompt, params)
        harness.run()
    finally:
        grammar.MEAN_CALL_LIMIT_S = saved
    (last,) = [out for out in harness.outputs["hostile"] if out.finished]
    assert last.error_code == "invalid_request" and "structured_outputs" in last.error and "simplify" in last.error
    assert failures == ["budget"]
    for name in ("fine", "plain"):
        assert harness.token_ids(name) == alone.token_ids(name)
        assert harness.finish_reason(name) == alone.finish_reason(name)


def test_a_matcher_in_its_error_state_is_an_error_never_a_stop(model, smollm2_tokenizer, compiler):
    """llguidance's error state (a limit hit mid-generation) used to allow only eos: a 200 with
    ``stop`` and output that fails its schema. It fails the request instead, counted as "error"."""
    from decoding.sampling.grammar import GrammarFailure, MaskBudget, RowGrammar

    class Erring:
        def is_error(self) -> bool:
            return True

        def get_error(self) -> str:
            return "parser too complex (step_max_items)"

    row = RowGrammar(Erring(), [EOS], MaskBudget("response_format"))
    with pytest.raises(GrammarFailure) as failure:
        row.fill(torch.zeros(8, dtype=torch.int32))
    assert failure.value.reason == "error" and str(failure.value).startswith("response_format: ")
    assert "step_max_items" in str(failure.value)
