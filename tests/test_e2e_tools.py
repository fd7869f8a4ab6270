"""Tool calling end to end: the real ``openai`` client, a real server with the embedded SmolLM2 (its
template ignores tools, so the shipped Hermes template renders them), a full round trip."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.shared_servers import PLAIN
from tests.test_e2e_openai import MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"],
        "additionalProperties": False}  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": CITY}}]  # fmt: skip
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]


def get_weather(city: str) -> dict:
    return {"city": city, "temperature_c": 3, "sky": "cloudy"}


@pytest.fixture(scope="module")
def client(shared_server):
    return openai.OpenAI(base_url=f"{shared_server(*PLAIN)}/v1", api_key="unused", max_retries=0)


def answer_calls(calls) -> list[dict]:
    """The assistant turn that made ``calls`` and one tool turn per call, with the function's result."""
    turn = {"role": "assistant", "content": None, "tool_calls": [
        {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
        for c in calls]}  # fmt: skip
    results = []
    for call in calls:
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, CITY)
        results.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(get_weather(**arguments))})
    return [turn, *results]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])  # fmt: skip
def test_a_tool_round_trip(client, choice):
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice,
                                           parallel_tool_calls=False, max_tokens=80, temperature=0)  # fmt: skip
    assert first.choices[0].finish_reason == "tool_calls"
    calls = first.choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "get_weather" and calls[0].id.startswith("call_")
    second = client.chat.completions.create(model=MODEL, messages=ASK + answer_calls(calls), tools=TOOLS,
                                            max_tokens=60, temperature=0)  # fmt: skip
    assert second.choices[0].finish_reason in ("stop", "length") and second.choices[0].message.content


def test_a_streamed_round_trip_assembles_like_the_non_streamed(client):
    request = dict(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                   max_tokens=80, temperature=0)  # fmt: skip
    whole = client.chat.completions.create(**request).choices[0].message.tool_calls
    with client.chat.completions.stream(**request) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole
    ]
    answer = client.chat.completions.create(model=MODEL, messages=ASK + answer_calls(final.message.tool_calls),
                                            tools=TOOLS, max_tokens=40, temperature=0, stream=True)  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in answer if c.choices)


def test_auto_lets_the_model_decide_and_none_offers_nothing(client):
    auto = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=60, temperature=0)
    message = auto.choices[0].message
    assert message.tool_calls or message.content  # either is the model's choice; both parse
    none = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=20,
                                          temperature=0)  # fmt: skip
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason in ("stop", "length")


def test_bad_tool_requests_are_400s_naming_the_field(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, max_tokens=5,
                                       tool_choice={"type": "function", "function": {"name": "nope"}})  # fmt: skip
    assert error.value.body["param"] == "tool_choice"
