"""``response_format`` and ``structured_outputs`` become one constraint naming the field sent."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from decoding import ParameterError
from server.api.chat.protocol import ChatCompletionRequest
from server.api.completions.protocol import CompletionRequest
from tests.fake_engine import FakeEngineClient
from tests.test_api import client_for, run

MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return ChatCompletionRequest(messages=MESSAGES, **fields).params({}).structured_output


def completion(**fields):
    return CompletionRequest(prompt="hi", **fields).params({}).structured_output


def test_openai_response_formats():
    assert chat(response_format={"type": "text"}) is None
    spec = chat(response_format={"type": "json_object"})
    assert (spec.kind, spec.value, spec.param) == ("json", {"type": "object"}, "response_format")
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}}}}
    loose = chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert loose.value == schema  # as sent: JSON Schema's default admits other properties
    strict_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    strict = chat(response_format=strict_format)
    assert strict.value["additionalProperties"] is False
    assert strict.value["properties"]["a"]["additionalProperties"] is False
    assert completion(response_format={"type": "json_object"}).param == "response_format"


def test_vllm_structured_outputs():
    assert completion(structured_outputs={"regex": "[0-9]+"}).kind == "regex"
    assert completion(structured_outputs={"choice": ["a", "b"]}).value == ["a", "b"]
    assert completion(structured_outputs={"json": '{"type": "integer"}'}).value == {"type": "integer"}
    assert completion(structured_outputs={"json_object": True}).value == {"type": "object"}
    assert completion(structured_outputs={"grammar": 'root ::= "x"'}).kind == "grammar"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}, "structured_outputs"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs"),
        ({"response_format": {"type": "json_object"}, "custom_generate": "m"}, "response_format"),
    ],
)
def test_bad_combinations_name_the_field(fields, param):
    with pytest.raises(ParameterError) as error:
        completion(**fields)
    assert error.value.param == param


def test_unknown_keys_are_refused():
    with pytest.raises(ValidationError):
        completion(structured_outputs={"regexp": "a"})
    with pytest.raises(ValidationError):
        completion(response_format={"type": "xml"})


def test_an_engine_without_a_compiler_refuses_with_a_400_naming_the_field():
    async def go():  # noqa: ANN202
        async with client_for(FakeEngineClient()) as http:
            body = {"prompt": "hi", "max_tokens": 3, "response_format": {"type": "json_object"}}
            answer = await http.post("/v1/completions", json=body)
            assert answer.status_code == 400 and answer.json()["error"]["param"] == "response_format"

    run(go())
