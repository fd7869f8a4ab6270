"""Tool calls under ``tool_choice: "auto"`` with ``strict``: free text until the model opens a call,
then a call the grammar holds to an offered name and its schema, under every strategy the engine
serves. A tiny random model would rarely write the call tag by itself, so the tag is made likely
(``sequence_bias``: its first token a little, each next one strongly once the ones before it are
there); everything after the tag is the grammar's doing."""

from __future__ import annotations

import json

import jsonschema
import pytest

from server.output.tool_parser import HermesStream, parse_whole
from server.translate.tools import Tool, call_grammar
from tests.structured_schemas import SCHEMAS
from tests.test_structured_engine import EOS, compiler, model, prompts, run, strategy_knobs  # noqa: F401

TAG_IDS = (44, 19324, 79, 4350, 46)  # "<tool_call>" in SmolLM2's tokenizer
TAG_BIAS = [[list(TAG_IDS[: k + 1]), 3.0 if k == 0 else 30.0] for k in range(len(TAG_IDS))]
STRATEGIES = ("greedy", "sampling", "beam", "prompt_lookup")


def tool_for(i: int, schema: dict) -> Tool:
    return Tool.model_validate({"type": "function", "function": {"name": f"tool_{i}", "parameters": schema,
                                                                   "strict": True}})  # fmt: skip


def test_every_parsed_call_names_an_offered_tool_and_validates(model, smollm2_tokenizer, compiler):  # noqa: F811
    from tests.test_structured_engine import constrained

    requests, offered = {}, {}
    for i, schema in enumerate(SCHEMAS[:32]):  # every strategy meets 8 of the schemas, all in one batch
        tools = [tool_for(i, schema), tool_for(100 + i, SCHEMAS[(i + 7) % len(SCHEMAS)])]
        spec = call_grammar(tools, "auto", parallel=True)
        name = STRATEGIES[i % len(STRATEGIES)]
        knobs = {**strategy_knobs(name), **({"seed": 300 + i} if name == "sampling" else {})}
        params = constrained(compiler, spec, max_new_tokens=200, sequence_bias=TAG_BIAS, **knobs)
        requests[f"{name}-{i}"] = (prompts(1, seed=i)[0], params)
        offered[f"{name}-{i}"] = {tool.function.name: tool.function.parameters for tool in tools}
    harness = run(model, smollm2_tokenizer, requests, max_num_seqs=512, max_num_batched_tokens=4096,
                  max_model_len=256)  # fmt: skip
    num_calls = 0
    for key in requests:
        names = offered[key]
        truncated = harness.finish_reason(key) == "length"
        _, calls = parse_whole(harness.text(key), lambda names=names: HermesStream(names), truncated)
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), names[call.name])
        num_calls += len(calls)
    assert num_calls >= len(requests)  # the tag was written and every call it opened parsed and validated


@pytest.mark.parametrize("name", ["contrastive", "dola", "beam_sampling"])
def test_other_strategies_keep_the_calls_valid(model, smollm2_tokenizer, compiler, name):  # noqa: F811
    from tests.test_structured_engine import constrained

    tools = [tool_for(0, SCHEMAS[0]), tool_for(1, SCHEMAS[3])]
    spec = call_grammar(tools, "auto", parallel=False)
    params = constrained(compiler, spec, max_new_tokens=160, sequence_bias=TAG_BIAS,
                         **strategy_knobs(name))  # fmt: skip
    harness = run(model, smollm2_tokenizer, {"r": (prompts(1, seed=9)[0], params)})
    _, calls = parse_whole(harness.text("r"), lambda: HermesStream(["tool_0", "tool_1"]))
    assert len(calls) == 1  # parallel_tool_calls false: exactly one, and nothing after it
    schema = {"tool_0": SCHEMAS[0], "tool_1": SCHEMAS[3]}[calls[0].name]
    jsonschema.validate(json.loads(calls[0].arguments), schema)
