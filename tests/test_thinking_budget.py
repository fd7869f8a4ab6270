"""A thinking budget (Anthropic's ``thinking.budget_tokens``): once a row has thought ``thinking_budget``
tokens, the end tag's ids are forced one by one, under every strategy, then the reply is free (and a
constraint on the answer holds after it); a reply that never opened its thinking is left alone."""

from __future__ import annotations

import json

import jsonschema
import pytest

from decoding.params import GenerationParams, ParameterError, validate
from decoding.params.model_checks import ModelFacts, check_against_model
from decoding.params.structured import StructuredOutput
from decoding.sampling.thinking import ThinkingBudget
from server.output.reasoning import FORMATS, split_reasoning
from server.translate.structured import thinking_then
from tests.test_structured_engine import STRATEGIES, compiler, constrained, model, prompts, run, strategy_knobs  # noqa: F401

END_IDS = [9617, 17400, 46]  # SmolLM2's "</", "think", ">"
BUDGET = 6


def ends_at(ids: list[int], tag: list[int]) -> int | None:
    """The position right after the first occurrence of ``tag`` in ``ids`` (None: absent)."""
    for i in range(len(ids) - len(tag) + 1):
        if ids[i : i + len(tag)] == tag:
            return i + len(tag)
    return None


def test_the_budget_forces_the_end_tag_then_frees_the_row():
    budget = ThinkingBudget(3, END_IDS)
    for token in (5, 6, 7):
        assert budget.forced() is None
        budget.append(token)
    assert budget.forced() == END_IDS[0]
    budget.append(END_IDS[0])
    assert budget.forced() == END_IDS[1]
    budget.append(END_IDS[1])
    budget.append(END_IDS[2])
    assert budget.forced() is None and budget.phase == "done"
    begun = ThinkingBudget(2, END_IDS)  # the reply itself began the tag: it is continued, not restarted
    begun.append(1)
    begun.append(END_IDS[0])
    assert begun.forced() == END_IDS[1]
    early = ThinkingBudget(10, END_IDS)  # the reply ended its thinking itself: nothing is forced later
    for token in [1, *END_IDS, *range(20)]:
        early.append(token)
    assert early.forced() is None


def test_a_reply_that_must_open_its_thinking_is_budgeted_only_when_it_does():
    opened = ThinkingBudget(2, END_IDS, start_ids=[40, 41])
    opened.append(40)
    opened.append(41)
    assert opened.forced() == END_IDS[0] and opened.phase == "thinking"
    plain = ThinkingBudget(2, END_IDS, start_ids=[40, 41])
    plain.append(40)
    plain.append(99)  # not the opening tag: the reply answers without thinking
    plain.append(3)
    assert plain.forced() is None and plain.phase == "done"
    forked = opened.fork()
    forked.append(END_IDS[0])
    assert opened.forced() == END_IDS[0] and forked.forced() == END_IDS[1]


@pytest.mark.parametrize("name", [s for s in STRATEGIES if s != "watermark"])
def test_every_strategy_ends_the_thinking_within_the_budget(model, smollm2_tokenizer, name):  # noqa: F811
    knobs = strategy_knobs(name)
    requests = {}
    for i, prompt in enumerate(prompts(3, seed=11)):
        base = dict(max_new_tokens=16, min_new_tokens=16, **knobs)
        requests[f"plain{i}"] = (prompt, GenerationParams(**base))
        requests[f"budget{i}"] = (prompt, GenerationParams(**base, thinking_budget=BUDGET, thinking_end_ids=END_IDS))
    harness = run(model, smollm2_tokenizer, requests)
    for i in range(3):
        plain, budgeted = harness.token_ids(f"plain{i}"), harness.token_ids(f"budget{i}")
        assert ends_at(plain, END_IDS) is None  # the random model never ends its thinking by itself
        end = ends_at(budgeted, END_IDS)
        assert end is not None and BUDGET < end <= BUDGET + len(END_IDS), f"{name}: {budgeted}"
        assert len(budgeted) == 16  # then the reply goes on, free
        if name in ("greedy", "sampling", "dola", "prompt_lookup", "early_exit", "guidance", "contrastive"):
            assert budgeted[:BUDGET] == plain[:BUDGET]  # nothing changes before the budget is spent


def test_the_answer_after_a_forced_end_keeps_its_constraint(model, smollm2_tokenizer, compiler):  # noqa: F811
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}  # fmt: skip
    spec = thinking_then(StructuredOutput("json", schema, "response_format"), FORMATS["deepseek_r1"])
    params = constrained(compiler, spec, max_new_tokens=60, thinking_budget=BUDGET, thinking_end_ids=END_IDS)
    harness = run(model, smollm2_tokenizer, {"r": (prompts(1, seed=4)[0], params)})
    ids, text = harness.token_ids("r"), harness.text("r")
    assert BUDGET < ends_at(ids, END_IDS) <= BUDGET + len(END_IDS)
    thinking, answer = split_reasoning(text, FORMATS["deepseek_r1"])
    assert thinking and harness.finish_reason("r") == "stop", text
    jsonschema.validate(json.loads(answer), schema)


def test_a_reply_that_does_not_open_its_thinking_is_left_alone(model, smollm2_tokenizer):  # noqa: F811
    prompt = prompts(1, seed=8)[0]
    plain = run(model, smollm2_tokenizer, {"r": (prompt, GenerationParams(max_new_tokens=12, min_new_tokens=12))})
    first = plain.token_ids("r")[0]
    params = {"max_new_tokens": 12, "min_new_tokens": 12, "thinking_budget": 3, "thinking_end_ids": END_IDS}
    other = run(model, smollm2_tokenizer, {"r": (prompt, GenerationParams(**params, thinking_start_ids=[first + 1]))})
    assert other.token_ids("r") == plain.token_ids("r")
    opened = run(model, smollm2_tokenizer, {"r": (prompt, GenerationParams(**params, thinking_start_ids=[first]))})
    assert opened.token_ids("r")[:3] == plain.token_ids("r")[:3] and ends_at(opened.token_ids("r"), END_IDS) == 6


@pytest.mark.parametrize(("fields", "message"), [
    ({"thinking_budget": 0, "thinking_end_ids": END_IDS}, ">= 1"),
    ({"thinking_budget": 5}, "end tag"),
    ({"thinking_budget": 5, "thinking_end_ids": []}, "end tag"),
    ({"thinking_end_ids": END_IDS}, "belong to a thinking_budget"),
    ({"thinking_budget": 5, "thinking_end_ids": END_IDS, "thinking_start_ids": [-1]}, "thinking_start_ids"),
    ({"thinking_budget": 5, "thinking_end_ids": END_IDS, "custom_generate": "m"}, "custom_generate"),
])  # fmt: skip
def test_a_malformed_budget_is_refused_naming_thinking(fields, message):
    with pytest.raises(ParameterError, match=message) as error:
        validate(GenerationParams(**fields))
    assert error.value.param == "thinking"


def test_the_tags_ids_must_be_the_models():
    params = GenerationParams(thinking_budget=5, thinking_end_ids=[10, 500])
    with pytest.raises(ParameterError, match="500") as error:
        check_against_model(params, ModelFacts(vocab_size=100, max_model_len=64), [[1, 2]])
    assert error.value.param == "thinking"
