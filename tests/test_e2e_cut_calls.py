"""A forced call cut by ``max_tokens`` right after its arguments, end to end: the real ``openai`` and
``anthropic`` clients against the shared plain server (tests/shared_servers.py) and the embedded
SmolLM2, greedy. The reply is cut inside the first call's closing tag: the call is finished (its JSON
is whole), so chat answers it with ``finish_reason: "length"``, Messages with ``stop_reason:
"max_tokens"`` (whole and streamed) and Responses with an incomplete response holding it; before,
chat and Messages lost it (``content: ""``, ``content: []``)."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from tests.shared_servers import PLAIN
from tests.test_e2e_openai import MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}  # fmt: skip
ASK = [{"role": "user", "content": "Record the people Ada Lovelace (36) and Alan Turing (41)."}]


@pytest.fixture(scope="module")
def server(shared_server) -> str:
    return shared_server(*PLAIN)


@pytest.fixture(scope="module")
def cut(server, smollm2_tokenizer) -> int:
    """The ``max_tokens`` that ends the greedy forced reply inside its first call's closing tag."""
    body = {"model": MODEL, "messages": ASK, "max_tokens": 60, "temperature": 0, "tool_choice": "required",
            "return_token_ids": True,
            "tools": [{"type": "function", "function": {"name": "record_person", "parameters": PERSON}}]}  # fmt: skip
    choice = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=300).json()["choices"][0]
    ids = choice["token_ids"]
    for k in range(1, len(ids) + 1):
        text = smollm2_tokenizer.decode(ids[:k])
        if "}}" in text:  # the first call's JSON is whole here, its closing tag not written yet
            assert "</tool_call>" not in text, text
            return k
    raise AssertionError(f"no complete call in {smollm2_tokenizer.decode(ids)!r}")


def test_a_call_finished_before_the_cut_is_kept_by_every_api(server, cut):
    chat = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    tool = {"name": "record_person", "parameters": PERSON}
    completion = chat.chat.completions.create(model=MODEL, messages=ASK, tools=[{"type": "function", "function": tool}],
                                              tool_choice="required", max_tokens=cut, temperature=0)  # fmt: skip
    (call,) = completion.choices[0].message.tool_calls
    assert completion.choices[0].finish_reason == "length" and call.function.name == "record_person"
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"name", "age"}

    response = chat.responses.create(model=MODEL, input=ASK[0]["content"], tools=[{"type": "function", **tool}],
                                     tool_choice="required", max_output_tokens=cut, temperature=0)  # fmt: skip
    assert response.status == "incomplete"
    assert [json.loads(item.arguments) for item in response.output if item.type == "function_call"] == [arguments]

    client = anthropic.Anthropic(base_url=server, api_key="unused", max_retries=0)
    request = {"model": MODEL, "max_tokens": cut, "messages": ASK, "extra_body": {"temperature": 0},
               "tools": [{"name": "record_person", "input_schema": PERSON}],
               "tool_choice": {"type": "any"}}  # fmt: skip
    message = client.messages.create(**request)
    with client.messages.stream(**request) as stream:
        streamed = stream.get_final_message()
    for reply in (message, streamed):
        assert reply.stop_reason == "max_tokens"
        assert [block.input for block in reply.content if block.type == "tool_use"] == [arguments]
