"""Every list-valued field has a length limit, enforced as a 400 naming it and stated in /openapi.json."""

from __future__ import annotations

import pytest

from decoding import GenerationParams, ParameterError
from decoding.params import SIZE_LIMITS, validate
from tests.fake_engine import FakeEngineClient
from tests.test_api import MODEL, client_for, error_of, run

# field -> (a value one over the item limit, the same field at the limit)
OVER_COUNT = {
    "stop": (["s"] * 17, ["s"] * 16),
    "stop_strings": (["s"] * 17, ["s"] * 16),
    "stop_token_ids": (list(range(1025)), list(range(1024))),
    "logit_bias": ({i: 1.0 for i in range(301)}, {i: 1.0 for i in range(300)}),
    "bad_words_ids": ([[i] for i in range(1025)], [[i] for i in range(1024)]),
    "sequence_bias": ([[[i], 1.0] for i in range(1025)], [[[i], 1.0] for i in range(1024)]),
    "suppress_tokens": ([1] * 262_145, [1] * 262_144),
    "begin_suppress_tokens": ([1] * 262_145, [1] * 262_144),
}


@pytest.mark.parametrize("name", sorted(OVER_COUNT))
def test_a_list_one_over_its_limit_is_refused_naming_the_field_and_the_limit(name):
    over, at = OVER_COUNT[name]
    with pytest.raises(ParameterError) as caught:
        validate(GenerationParams(**{name: over}))
    error = caught.value
    assert error.param == name and error.code == "too_many_items"
    assert str(SIZE_LIMITS[name].max_items) in error.message
    validate(GenerationParams(**{name: at}))  # the limit itself is admitted


@pytest.mark.parametrize(
    ("name", "long_item"),
    [("stop", "x" * 513), ("stop_strings", "x" * 513), ("bad_words_ids", list(range(33))),
     ("sequence_bias", [list(range(33)), 1.0])],
)  # fmt: skip
def test_an_item_over_its_length_is_refused_with_its_index(name, long_item):
    with pytest.raises(ParameterError) as caught:
        validate(GenerationParams(**{name: [long_item]}))
    assert caught.value.param == name and caught.value.code == "too_long" and f"{name}[0]" in caught.value.message


def test_dola_layers_list_is_bounded():
    with pytest.raises(ParameterError) as caught:
        validate(GenerationParams(dola_layers=list(range(257))))
    assert caught.value.param == "dola_layers"


def _post(path: str, body: dict):  # noqa: ANN202
    async def go():  # noqa: ANN202
        async with client_for(FakeEngineClient()) as http:
            return await http.post(path, json=body)

    return run(go())


def test_the_server_refuses_more_prompts_messages_or_tools_than_allowed():
    r = _post("/v1/completions", {"model": MODEL, "prompt": ["hi"] * 129, "max_tokens": 1})
    assert r.status_code == 400 and error_of(r)["param"] == "prompt" and "128" in error_of(r)["message"]
    assert _post("/v1/completions", {"model": MODEL, "prompt": ["hi"] * 2, "max_tokens": 1}).status_code == 200
    messages = [{"role": "user", "content": "hi"}] * 2049
    r = _post("/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 1})
    assert r.status_code == 400 and error_of(r)["param"] == "messages"
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    r = _post("/v1/chat/completions", {"model": MODEL, "messages": messages[:1], "tools": [tool] * 129})
    assert r.status_code == 400 and error_of(r)["param"] == "tools"


def test_logit_bias_over_300_is_a_400_through_the_api():
    r = _post("/v1/completions", {"model": MODEL, "prompt": "hi", "logit_bias": {str(i): 1 for i in range(301)}})
    assert r.status_code == 400 and error_of(r)["param"] == "logit_bias"


def test_openapi_states_the_same_limits():
    async def go():  # noqa: ANN202
        async with client_for(FakeEngineClient()) as http:
            return (await http.get("/openapi.json")).json()

    schemas = run(go())["components"]["schemas"]
    props = schemas["CompletionRequest"]["properties"]

    def branch(name: str, kind: str) -> dict:
        return next(b for b in props[name].get("anyOf", [props[name]]) if b.get("type") == kind)

    assert branch("logit_bias", "object")["maxProperties"] == 300
    assert branch("stop", "array")["maxItems"] == 16 and branch("stop", "array")["items"]["maxLength"] == 512
    assert branch("stop", "string")["maxLength"] == 512
    assert branch("bad_words_ids", "array")["maxItems"] == 1024
    assert branch("bad_words_ids", "array")["items"]["maxItems"] == 32
    assert branch("suppress_tokens", "array")["maxItems"] == SIZE_LIMITS["suppress_tokens"].max_items
    prompt_lists = [b for b in props["prompt"]["anyOf"] if b.get("type") == "array"]
    assert {b.get("maxItems") for b in prompt_lists if b["items"].get("type") != "integer"} == {128}
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert any(b.get("maxItems") == 2048 for b in chat["messages"].get("anyOf", [chat["messages"]]))
    assert any(b.get("maxItems") == 128 for b in chat["tools"].get("anyOf", [chat["tools"]]))
