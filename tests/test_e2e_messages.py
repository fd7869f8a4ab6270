"""The Messages API end to end: the real ``anthropic`` SDK against a real server with the embedded
SmolLM2 (the session's shared one): create, stream (``text_stream`` and the final message;
``create(stream=True)``'s raw events), a ``tool_use`` -> ``tool_result`` round trip streamed and not,
``count_tokens`` against chat's ``prompt_tokens``, errors as the SDK's exceptions, and beam search
and contrastive search through ``extra_body`` token-identical to the same chat request. The API key
(the SDK sends it as ``x-api-key``: accepted, and a wrong one refused in Anthropic's shape) is checked
against a real uvicorn whose app requires one, over the fake engine: the key check comes before any
model, and the shared server has no key."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import jsonschema
import openai
import pytest

from server.app import create_app
from server.config.settings import Settings
from tests.fake_engine import FakeEngineClient
from tests.shared_servers import PLAIN
from tests.test_e2e_openai import MODEL
from tests.threaded_server import uvicorn_in_thread

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

KEY = "messages-e2e-key"
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"],
        "additionalProperties": False}  # fmt: skip
TOOLS = [{"name": "get_weather", "description": "Current weather in a city", "input_schema": CITY}]
FORCED = {"type": "tool", "name": "get_weather"}
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
FAKE_MODEL = FakeEngineClient.model_name
# this SDK's create() no longer names the sampling fields: they travel in the body as any extra field does
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server(shared_server) -> str:
    return shared_server(*PLAIN)


@pytest.fixture(scope="module")
def keyed_server() -> Iterator[str]:
    """A real uvicorn whose app requires ``KEY``, over the fake engine (a thread of this process)."""
    with uvicorn_in_thread(create_app(Settings(api_key=KEY), engine_client=FakeEngineClient())) as base:
        yield base


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server, api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def chat(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)


def test_create(client):
    question = [{"role": "user", "content": "What is the capital of France?"}]
    message = client.messages.create(model=MODEL, max_tokens=30, messages=question, system="Answer in one sentence.",
                                     extra_body=GREEDY)  # fmt: skip
    assert message.id.startswith("msg_") and message.role == "assistant" and message.model == MODEL
    (block,) = message.content
    assert block.type == "text" and "Paris" in block.text
    assert message.stop_reason in ("end_turn", "max_tokens") and message.usage.output_tokens > 0
    counted = client.messages.count_tokens(model=MODEL, messages=question, system="Answer in one sentence.")
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == counted.input_tokens


def test_stream_reads_as_the_created_message(client):
    body = {"model": MODEL, "max_tokens": 40, "extra_body": GREEDY,
            "messages": [{"role": "user", "content": "Say hello in one sentence."}]}  # fmt: skip
    with client.messages.stream(**body) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    created = client.messages.create(**body)
    assert streamed and final.content[0].text == streamed == created.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == (created.stop_reason, created.usage.output_tokens)
    kinds = [event.type for event in client.messages.create(**body, stream=True)]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-2:] == ["message_delta", "message_stop"]
    assert "content_block_delta" in kinds and "ping" not in kinds  # the SDK reads ping and skips it


def _tool_use(message: anthropic.types.Message) -> anthropic.types.ToolUseBlock:
    assert message.stop_reason == "tool_use"
    (block,) = [block for block in message.content if block.type == "tool_use"]
    assert block.name == "get_weather" and block.id.startswith("toolu_")
    jsonschema.validate(block.input, CITY)
    return block


def _answer_turns(first: anthropic.types.Message, block: anthropic.types.ToolUseBlock) -> list[dict]:
    result = json.dumps({"city": block.input["city"], "temperature_c": 3, "sky": "cloudy"})
    return ASK + [{"role": "assistant", "content": first.content},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": result}]}]


def test_a_tool_use_round_trip(client):
    first = client.messages.create(model=MODEL, max_tokens=80, messages=ASK, tools=TOOLS, tool_choice=FORCED,
                                   extra_body=GREEDY)  # fmt: skip
    block = _tool_use(first)
    second = client.messages.create(model=MODEL, max_tokens=60, messages=_answer_turns(first, block), tools=TOOLS,
                                    extra_body=GREEDY)  # fmt: skip
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use") and second.content
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens > first.usage.input_tokens


def test_a_streamed_tool_use_round_trip(client):
    request = {"model": MODEL, "max_tokens": 80, "extra_body": GREEDY, "messages": ASK, "tools": TOOLS,
               "tool_choice": FORCED}  # fmt: skip
    with client.messages.stream(**request) as stream:
        first = stream.get_final_message()
    block = _tool_use(first)
    assert block.input == _tool_use(client.messages.create(**request)).input  # the same call, streamed or not
    with client.messages.stream(model=MODEL, max_tokens=60, messages=_answer_turns(first, block), tools=TOOLS,
                                extra_body=GREEDY) as stream:  # fmt: skip
        text = "".join(stream.text_stream)
        second = stream.get_final_message()
    assert second.stop_reason is not None and (text or second.stop_reason == "tool_use")


def test_count_tokens_is_chats_prompt(client, chat):
    conversation = [{"role": "user", "content": "Name a colour."}]
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                               "parameters": CITY}}]  # fmt: skip
    counted = client.messages.count_tokens(model=MODEL, messages=conversation, system="Be brief.", tools=TOOLS)
    completion = chat.chat.completions.create(model=MODEL, max_tokens=1, tools=tools,
                                              messages=[{"role": "system", "content": "Be brief."}, *conversation])
    assert counted.input_tokens == completion.usage.prompt_tokens


def test_errors_are_the_sdks_exceptions_in_anthropics_shape(client, keyed_server):
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no-such-model", max_tokens=5, messages=ASK)
    assert missing.value.body["type"] == "error" and missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as unknown:
        client.messages.create(model=MODEL, max_tokens=5, messages=ASK, extra_body={"num_beam": 2})
    assert unknown.value.body["error"]["type"] == "invalid_request_error"
    assert "num_beam" in unknown.value.body["error"]["message"]
    keyed = anthropic.Anthropic(base_url=keyed_server, api_key=KEY, max_retries=0)
    assert keyed.messages.create(model=FAKE_MODEL, max_tokens=3, messages=ASK).content  # the SDK's key is accepted
    with pytest.raises(anthropic.AuthenticationError) as refused:
        anthropic.Anthropic(base_url=keyed_server, api_key="wrong", max_retries=0).messages.create(
            model=FAKE_MODEL, max_tokens=5, messages=ASK)
    assert refused.value.body["error"]["type"] == "authentication_error"


@pytest.mark.parametrize("knobs", [{"num_beams": 2}, {"penalty_alpha": 0.6, "top_k": 4}],
                         ids=["beam_search", "contrastive_search"])  # fmt: skip
def test_strategies_are_token_identical_to_chat(client, chat, knobs):
    question = [{"role": "user", "content": "Name three colours."}]
    reference = chat.chat.completions.create(model=MODEL, messages=question, max_tokens=24, temperature=0,
                                             extra_body={**knobs, "return_token_ids": True})  # fmt: skip
    message = client.messages.create(model=MODEL, messages=question, max_tokens=24, extra_body={**GREEDY, **knobs})
    assert message.content[0].text == reference.choices[0].message.content
    assert message.usage.output_tokens == len(reference.choices[0].token_ids)
