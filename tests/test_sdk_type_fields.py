"""Every field the installed ``openai`` and ``anthropic`` packages' own types define is accepted.

Clients replay the SDKs' objects as dicts (``ResponseFunctionToolCall.model_dump(by_alias=True)``,
anthropic's ``[b.model_dump() for b in message.content]``) and build bodies from their param
``TypedDict``s, so each field those types define, null or set to a plausible value, must be honoured,
accepted as a documented no-op, or refused with a 400 naming that field and saying it is not served,
never refused merely for being there. ``tests.sdk_walk`` builds the bodies from the types (their
walk is the test: a new SDK release that adds a field fails here until the server knows it); the
app runs in process on the fake engine. The SDK versions are pinned in pyproject's test extras.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import typing_extensions
from anthropic.types import DirectCaller, MessageParam, TextBlockParam, ToolChoiceParam, ToolUnionParam, ToolUseBlock
from anthropic.types.message_count_tokens_params import MessageCountTokensParams
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from anthropic.types.user_message_param import UserMessageParam
from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageParam, ChatCompletionToolUnionParam
from openai.types.chat.chat_completion_tool_choice_option_param import ChatCompletionToolChoiceOptionParam
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming as ChatCreateParams
from openai.types.completion_create_params import CompletionCreateParamsNonStreaming as CompletionCreateParams
from openai.types.responses import ResponseFunctionToolCall, ResponseInputItemParam, ResponseOutputItem, ToolParam
from openai.types.responses.input_token_count_params import InputTokenCountParams
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming, ToolChoice

from decoding import ServedModel
from server.api.responses.truncation import droppable_units
from server.app import create_app
from server.config.settings import Settings
from tests.fake_engine import FakeEngineClient
from tests.sdk_walk import Variant, branches, is_record, minimal, values, walk
from tests.shared_servers import PLAIN
from tests.test_api import MODEL, client_for, error_of, post, run
from tests.test_e2e_openai import MODEL as E2E_MODEL
from tests.test_responses_api import RecordingEngine, Server

# what a refusal of something this server does not run says (the field is named beside it)
NOT_SERVED = re.compile(r"not served|not supported|does not support|does not run|text-only")
HELLO = {"role": "user", "content": "hello"}
FUNCTION_TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
ANTHROPIC_TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}
ASSISTANT_BLOCKS = {"tool_use", "server_tool_use", "thinking", "redacted_thinking"}


def content_blocks() -> Any:  # noqa: ANN401
    """Every block a Messages turn may hold: the param types and the reply's blocks replayed."""
    content = typing_extensions.get_type_hints(UserMessageParam, include_extras=True)["content"]
    (listed,) = [branch for branch in branches(content) if branch is not str]
    return typing_extensions.get_args(listed)[0]


@dataclass
class Slot:
    """Where an SDK type goes in a request: the route, the body around it, the value's path."""

    route: str
    hint: Any
    at: str
    body: Callable[[Any], dict]
    anthropic: bool = False
    walked_elsewhere: tuple[Any, ...] = ()  # records whose fields another slot walks (where they make sense)
    plausible: Callable[[Any], bool] = lambda value: True  # what the API itself would send, of all the types allow


def _blocks_in_their_turn(message: Any) -> bool:  # noqa: ANN401
    """A turn whose blocks Anthropic allows in it: calls in an assistant turn, results in a user turn."""
    kinds = {block.get("type") for block in message.get("content") or [] if isinstance(block, dict)}
    if message.get("role") == "assistant":
        return "tool_result" not in kinds
    return not kinds & ASSISTANT_BLOCKS


def _anthropic_turns(block: Any) -> dict:  # noqa: ANN401
    role = "assistant" if isinstance(block, dict) and block.get("type") in ASSISTANT_BLOCKS else "user"
    turns = [HELLO, {"role": role, "content": [block]}, HELLO]
    return {"model": MODEL, "max_tokens": 1, "messages": turns}


def _counted(fields: dict) -> dict:
    """A count's body: a message after the items (a conversation of a reasoning item alone has none),
    a tool for a tool_choice to name."""
    given = fields.get("input", "hello")
    tools = fields.get("tools") or ([FUNCTION_TOOL] if fields.get("tool_choice") is not None else None)
    return {**fields, "input": [*given, HELLO] if isinstance(given, list) else given, "tools": tools}


def _something_to_count(fields: dict) -> bool:
    """Not a count of nothing, of a response that was never stored, or for a model not served."""
    return not ("input" in fields and fields["input"] is None) and fields.get("previous_response_id") is None and \
        fields.get("model") in (None, MODEL)  # fmt: skip


def _responses_body(fields: dict) -> dict:
    """A response's body around the fields: an input (a message after listed items), a short reply, a
    tool for a tool_choice to name, ``include`` for ``top_logprobs`` (whose logprobs it asks for)."""
    body = {"max_output_tokens": 1, **_counted(fields)}
    if body.get("top_logprobs") is not None and body.get("include") is None:
        body["include"] = ["message.output_text.logprobs"]
    return body


def _a_response_to_something(fields: dict) -> bool:
    """Not a response to nothing, to a response never stored, or of a model not served."""
    return _something_to_count(fields)


def _with_tools(fields: dict, tool: dict, model: str = MODEL) -> dict:
    """A body around ``fields`` for the served model: a tool for a ``tool_choice`` to name."""
    body = {**fields, "model": model}
    if body.get("tool_choice") is not None and not body.get("tools"):
        body["tools"] = [tool]
    return body


def _chat_body(fields: dict) -> dict:
    """A chat body around the fields: a short reply, a tool for a tool_choice (legacy: a function for a
    function_call), ``logprobs`` for ``top_logprobs`` (OpenAI requires it)."""
    body = _with_tools({"max_tokens": 1, **fields}, CHAT_TOOL)
    if body.get("function_call") is not None and not body.get("functions"):
        body["functions"] = [CHAT_TOOL["function"]]
    if body.get("top_logprobs") is not None:
        body["logprobs"] = True
    return body


def _the_simplest_model(record: type) -> Callable[[dict], bool]:
    """Only the record's minimal ``model`` (sent as the served model): another names a model not served."""
    simplest = minimal(record).get("model")
    return lambda fields: fields.get("model") == simplest


def _anthropic_plausible(record: type) -> Callable[[dict], bool]:
    """The served model, a conversation that ends with a user turn (the "messages-messages" slot walks the
    turns; a prefill is refused in tests/test_messages_api.py); ``thinking`` enabled is left to the
    reasoning tests (it needs --reasoning-parser and a budget of 1024 tokens or more)."""
    served = _the_simplest_model(record)

    def plausible(fields: dict) -> bool:
        last = (fields.get("messages") or [{}])[-1]
        return served(fields) and last.get("role") != "assistant" and \
            (fields.get("thinking") or {}).get("type") != "enabled"  # fmt: skip

    return plausible


# the top-level fields of each API's create (and count) params; their items, messages, blocks, tools and
# choices are walked by the slots below, each where it makes sense
TOP_LEVEL = {
    "responses-body": Slot("/v1/responses", ResponseCreateParamsNonStreaming, "", _responses_body,
                           walked_elsewhere=(ResponseInputItemParam, ToolParam, ToolChoice),
                           plausible=_a_response_to_something),
    "chat-body": Slot("/v1/chat/completions", ChatCreateParams, "", _chat_body,
                      walked_elsewhere=(ChatCompletionMessageParam, ChatCompletionToolUnionParam,
                                        ChatCompletionToolChoiceOptionParam),
                      plausible=_the_simplest_model(ChatCreateParams)),
    "completions-body": Slot("/v1/completions", CompletionCreateParams, "",
                             lambda fields: {"max_tokens": 1, **fields, "model": MODEL},
                             plausible=_the_simplest_model(CompletionCreateParams)),
    "messages-body": Slot("/v1/messages", MessageCreateParamsNonStreaming, "",
                          lambda fields: _with_tools(fields, ANTHROPIC_TOOL), anthropic=True,
                          walked_elsewhere=(MessageParam, TextBlockParam, ToolUnionParam, ToolChoiceParam),
                          plausible=_anthropic_plausible(MessageCreateParamsNonStreaming)),
    "messages-count-body": Slot("/v1/messages/count_tokens", MessageCountTokensParams, "",
                                lambda fields: _with_tools(fields, ANTHROPIC_TOOL), anthropic=True,
                                walked_elsewhere=(MessageParam, TextBlockParam, ToolUnionParam, ToolChoiceParam),
                                plausible=_anthropic_plausible(MessageCountTokensParams)),
}  # fmt: skip

SLOTS = {
    **TOP_LEVEL,
    "responses-input": Slot("/v1/responses", ResponseInputItemParam, "input[0]",
                            lambda item: {"input": [item, HELLO], "max_output_tokens": 1}),
    "responses-output-items": Slot("/v1/responses", ResponseOutputItem, "input[0]",
                                   lambda item: {"input": [item, HELLO], "max_output_tokens": 1}),
    "responses-tools": Slot("/v1/responses", ToolParam, "tools[0]",
                            lambda tool: {"input": "hello", "tools": [tool], "max_output_tokens": 1}),
    "responses-tool-choice": Slot("/v1/responses", ToolChoice, "tool_choice",
                                  lambda choice: {"input": "hello", "tools": [FUNCTION_TOOL], "tool_choice": choice,
                                                  "max_output_tokens": 1}),
    "chat-messages": Slot("/v1/chat/completions", ChatCompletionMessageParam, "messages[0]",
                          lambda message: {"model": MODEL, "messages": [message, HELLO], "max_tokens": 1}),
    "chat-reply-replayed": Slot("/v1/chat/completions", ChatCompletionMessage, "messages[0]",
                                lambda message: {"model": MODEL, "messages": [message, HELLO], "max_tokens": 1}),
    "chat-tools": Slot("/v1/chat/completions", ChatCompletionToolUnionParam, "tools[0]",
                       lambda tool: {"model": MODEL, "messages": [HELLO], "tools": [tool], "max_tokens": 1}),
    "chat-tool-choice": Slot("/v1/chat/completions", ChatCompletionToolChoiceOptionParam, "tool_choice",
                             lambda choice: {"model": MODEL, "messages": [HELLO], "tools": [CHAT_TOOL],
                                             "tool_choice": choice, "max_tokens": 1}),
    # the body itself: its items, tools and choices are walked above
    "responses-input-tokens": Slot("/v1/responses/input_tokens", InputTokenCountParams, "", _counted,
                                   walked_elsewhere=(ResponseInputItemParam, ToolParam, ToolChoice),
                                   plausible=_something_to_count),
    # a turn's blocks are walked by "messages-blocks", each in the turn that may carry it
    "messages-messages": Slot("/v1/messages", MessageParam, "messages[0]",
                              lambda message: {"model": MODEL, "max_tokens": 1, "messages": [message, HELLO]},
                              anthropic=True, walked_elsewhere=(content_blocks(), TextBlockParam),
                              plausible=_blocks_in_their_turn),
    "messages-blocks": Slot("/v1/messages", content_blocks(), "messages[1].content[0]", _anthropic_turns,
                            anthropic=True),
    "messages-system": Slot("/v1/messages", TextBlockParam, "system[0]",
                            lambda block: {"model": MODEL, "max_tokens": 1, "messages": [HELLO], "system": [block]},
                            anthropic=True),
    "messages-tools": Slot("/v1/messages", ToolUnionParam, "tools[0]",
                           lambda tool: {"model": MODEL, "max_tokens": 1, "messages": [HELLO], "tools": [tool]},
                           anthropic=True),
    "messages-tool-choice": Slot("/v1/messages", ToolChoiceParam, "tool_choice",
                                 lambda choice: {"model": MODEL, "max_tokens": 1, "messages": [HELLO],
                                                 "tools": [ANTHROPIC_TOOL], "tool_choice": choice},
                                 anthropic=True),
}  # fmt: skip


async def get(engine: FakeEngineClient, path: str, **settings: object) -> httpx.Response:
    async with client_for(engine, **settings) as http:
        return await http.get(path)


def _names(error: str, path: str, anthropic: bool, param: str | None) -> bool:
    """Whether the refusal names ``path`` (or a field inside it)."""
    if anthropic:
        return path in error
    return param is not None and (param == path or param.startswith((path + ".", path + "[")))


def run_slot(slot: Slot, tmp_path: Path) -> list[str]:
    """Every variant of every type the slot takes, sent; what was refused that should not be."""
    settings = Settings(responses_store=f"sqlite:///{tmp_path / 'responses.db'}")
    app = create_app(settings, engine_client=RecordingEngine())
    loop = asyncio.new_event_loop()
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    failures: list[str] = []

    def send(variant: Variant) -> bool:
        if not slot.plausible(variant.value):
            return variant.whole
        response = loop.run_until_complete(http.post(slot.route, json=slot.body(variant.value)))
        if response.status_code == 200:
            return False
        error = response.json()["error"]
        param = error.get("param")
        if response.status_code == 400 and NOT_SERVED.search(error["message"]) and \
                _names(error["message"], variant.path, slot.anthropic, param):  # fmt: skip
            return variant.whole
        failures.append(f"{variant.note} at {variant.path}: {response.status_code} {error['message']}")
        return variant.whole  # its fields are refused the same way: one failure says it

    try:
        seen = {record for hint in slot.walked_elsewhere for record in branches(hint) if is_record(record)}
        for branch in branches(slot.hint):
            if is_record(branch):
                walk(branch, slot.at, send, seen)
            else:
                for value in values(branch):
                    send(Variant(type(value), slot.at, value, f"{value!r}"))
    finally:
        loop.run_until_complete(http.aclose())
        loop.close()
    return failures


@pytest.mark.parametrize("name", sorted(SLOTS))
def test_every_field_of_the_sdk_types_is_served_or_refused_by_name(name, tmp_path):
    failures = run_slot(SLOTS[name], tmp_path)
    assert not failures, f"{len(failures)} refused:\n" + "\n".join(failures)


# ---- the SDKs' own objects, replayed ------------------------------------------------------------------
def test_the_sdks_reply_objects_replayed_as_dicts_are_the_next_turn(tmp_path):
    """The issue's two cases: the openai SDK's function call item and anthropic's tool_use block, dumped
    whole (``async``, ``caller``, ``namespace``, ``toolset_name`` included), render as the call."""
    call = ResponseFunctionToolCall(
        type="function_call", call_id="call_1", name="get_weather", arguments='{"city": "Oslo"}', status="completed"
    ).model_dump(by_alias=True)
    assert {"async", "caller", "namespace"} <= set(call)
    server = Server(tmp_path)
    server.create({"input": [HELLO, call, {"type": "function_call_output", "call_id": "call_1", "output": "3 C"}],
                   "tools": [FUNCTION_TOOL]})  # fmt: skip
    messages, _ = server.engine.templates[-1]
    assert messages[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Oslo"}}
    block = ToolUseBlock(type="tool_use", id="toolu_1", name="get_weather", input={"city": "Oslo"},
                         caller=DirectCaller(type="direct")).model_dump()  # fmt: skip
    assert {"caller", "toolset_name"} <= set(block)
    engine = RecordingEngine()
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3 C"}
    turns = [HELLO, {"role": "assistant", "content": [block]}, {"role": "user", "content": [result]}]
    response = run(post(engine, "/v1/messages", {"model": MODEL, "max_tokens": 1, "messages": turns,
                                                 "tools": [ANTHROPIC_TOOL]}))  # fmt: skip
    assert response.status_code == 200, response.text
    assert engine.templates[-1][0][1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}


def test_a_function_output_without_call_id_answers_the_oldest_unanswered_call(tmp_path):
    server = Server(tmp_path)
    items = [HELLO,
             {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": "{}"},
             {"type": "function_call", "call_id": "call_b", "name": "get_time", "arguments": "{}"},
             {"type": "function_call_output", "name": "get_time", "output": [{"type": "input_text", "text": "noon"}]},
             {"type": "function_call_output", "output": "3 C"}]  # fmt: skip
    server.create({"input": items})
    tool_turns = [m for m in server.engine.templates[-1][0] if m["role"] == "tool"]
    assert tool_turns == [{"role": "tool", "tool_call_id": "call_b", "content": "noon", "name": "get_time"},
                          {"role": "tool", "tool_call_id": "call_a", "content": "3 C"}]  # fmt: skip

    stored = [{"type": "message", "role": "user", "content": []},
              {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": "{}"},
              {"type": "function_call_output", "call_id": None, "output": "3 C"}]  # fmt: skip
    assert droppable_units(stored) == [[0], [1, 2]]  # truncation keeps the output with the call it answers


def test_a_replayed_refusal_is_the_assistant_turns_text(tmp_path):
    server = Server(tmp_path)
    refusal = {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "I can't"}]}
    server.create({"input": [HELLO, refusal, HELLO]})
    assert server.engine.templates[-1][0][1] == {"role": "assistant", "content": "I can't"}


# ---- allowed_tools ------------------------------------------------------------------------------------
TIME_TOOL = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}


def test_allowed_tools_offers_only_the_tools_it_names(tmp_path):
    server = Server(tmp_path)
    choice = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_time"}]}
    body = server.create({"input": "hello", "tools": [FUNCTION_TOOL, TIME_TOOL], "tool_choice": choice})
    assert [tool["function"]["name"] for tool in server.engine.templates[-1][1]] == ["get_time"]
    assert server.engine.submitted[-1][2].structured_output.kind == "grammar"  # required: a call is forced
    assert body["tool_choice"] == choice
    engine = RecordingEngine()
    allowed = {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
        {"type": "function", "function": {"name": "get_weather"}}]}}  # fmt: skip
    tools = [CHAT_TOOL, {"type": "function", "function": {"name": "get_time"}}]
    response = run(post(engine, "/v1/chat/completions", {"model": MODEL, "messages": [HELLO], "max_tokens": 1,
                                                         "tools": tools, "tool_choice": allowed}))  # fmt: skip
    assert response.status_code == 200, response.text
    assert [tool["function"]["name"] for tool in engine.templates[-1][1]] == ["get_weather"]


def test_allowed_tools_naming_a_tool_not_offered_is_a_400(tmp_path):
    choice = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "get_time"}]}
    response = Server(tmp_path).call("POST", "/v1/responses", {"input": "hello", "tools": [FUNCTION_TOOL],
                                                               "tool_choice": choice})  # fmt: skip
    assert response.status_code == 400 and error_of(response)["param"] == "tool_choice"
    assert "get_time" in error_of(response)["message"]


# ---- GET /v1/models/{id}, GET /version, POST /v1/responses/input_tokens -------------------------------
class AdapterEngine(RecordingEngine):
    """The fake engine serving a LoRA adapter whose name holds a slash, as a hub id does."""

    def served_models(self) -> list[ServedModel]:
        return [*super().served_models(), ServedModel("org/sql-lora", "lora", 64, parent=MODEL, root="/adapters/sql")]

    def lora_names(self) -> list[str]:
        return ["org/sql-lora"]


def openai_client(app: Any) -> openai.AsyncOpenAI:  # noqa: ANN401
    """The real ``openai`` client on the app in process."""
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", max_retries=0, http_client=http)


def test_models_retrieve_by_the_openai_client_reads_as_the_list_entry():
    app = create_app(Settings(), engine_client=AdapterEngine())

    async def go() -> None:
        client = openai_client(app)
        listed = {model.id: model.model_dump() for model in (await client.models.list()).data}
        for name in (MODEL, "org/sql-lora"):  # the SDK sends org%2Fsql-lora
            model = await client.models.retrieve(name)
            assert model.id == name and model.object == "model" and model.owned_by == "decoda"
            assert {**model.model_dump(), "created": 0} == {**listed[name], "created": 0}
        assert (await client.models.retrieve("org/sql-lora")).model_extra["parent"] == MODEL
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("nope")

    run(go())


def test_an_unknown_model_is_openais_404():
    response = run(get(FakeEngineClient(), "/v1/models/no/such-model"))
    assert response.status_code == 404
    assert error_of(response) == {
        "message": f"The model 'no/such-model' does not exist; this server serves '{MODEL}'",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }


def test_version_is_open_and_names_the_installed_release():
    engine = FakeEngineClient()
    response = run(get(engine, "/version", api_key="secret"))
    assert response.status_code == 200 and response.json() == {"version": importlib.metadata.version("decoda")}
    assert run(get(engine, f"/v1/models/{MODEL}", api_key="secret")).status_code == 401  # the API is not


def test_input_tokens_count_is_the_prompt_a_response_with_those_fields_reads(tmp_path):
    server = Server(tmp_path)
    app = server.app

    async def go() -> None:
        client = openai_client(app)
        fields = {"model": MODEL, "instructions": "answer in words", "tools": [FUNCTION_TOOL],
                  "input": [{"role": "user", "content": "the weather in Oslo"}]}  # fmt: skip
        counted = await client.responses.input_tokens.count(**fields)
        assert counted.object == "response.input_tokens"
        first = await client.responses.create(**fields, max_output_tokens=2)
        assert counted.input_tokens == first.usage.input_tokens > 0
        more = {"model": MODEL, "previous_response_id": first.id, "input": "and tomorrow"}
        counted = await client.responses.input_tokens.count(**more)
        second = await client.responses.create(**more, max_output_tokens=2)
        assert counted.input_tokens == second.usage.input_tokens > first.usage.input_tokens

    run(go())
    assert server.engine.templates[-1] == server.engine.templates[-2]  # the count rendered the same prompt


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": "nope", "input": "hi"}, 404, "model"),
    ({"input": "hi", "previous_response_id": "resp_none"}, 404, "previous_response_id"),
    ({"input": "hi", "personality": "friendly"}, 400, "personality"),
    ({"input": "hi", "conversation": "conv_1"}, 400, "conversation"),
    ({"input": "hi", "max_output_tokens": 3}, 400, "max_output_tokens"),  # not a field of the count
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, 400, "input"),
])  # fmt: skip
def test_input_tokens_refusals_name_the_field(tmp_path, body, status, param):
    response = Server(tmp_path).call("POST", "/v1/responses/input_tokens", body)
    assert response.status_code == status, response.text
    assert error_of(response)["param"] == param


def test_openapi_states_the_new_operations_and_their_errors():
    doc = run(get(FakeEngineClient(), "/openapi.json")).json()
    models = doc["paths"]["/v1/models/{model_id}"]["get"]["responses"]
    assert {"200", "401", "404", "429", "500", "503"} <= set(models) and "422" not in models
    counting = doc["paths"]["/v1/responses/input_tokens"]["post"]
    assert {"200", "400", "404", "413", "429", "500", "503"} <= set(counting["responses"])
    body = counting["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    fields = set(doc["components"]["schemas"][body]["properties"])
    assert {"input", "instructions", "previous_response_id", "tools", "tool_choice", "personality", "conversation",
            "truncation", "text", "reasoning", "parallel_tool_calls", "model"} <= fields  # fmt: skip
    assert "security" not in doc["paths"]["/version"]["get"]


def test_a_method_input_tokens_does_not_take_is_its_own_405():
    async def options() -> httpx.Response:
        async with client_for(FakeEngineClient()) as http:
            return await http.options("/v1/responses/input_tokens")

    response = run(options())
    assert response.status_code == 405 and response.headers["allow"] == "POST"


@pytest.mark.e2e
@pytest.mark.slow
def test_the_real_server_retrieves_models_counts_input_tokens_and_names_its_version(shared_server):
    """Against ``decoda serve`` with SmolLM2: the count is the prompt its chat template renders with the
    tools, the ``usage.input_tokens`` of the same response."""
    base = shared_server(*PLAIN)
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    assert client.models.retrieve(E2E_MODEL).id == E2E_MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    fields = {"model": E2E_MODEL, "instructions": "Answer briefly.", "input": "What is the weather in Paris?",
              "tools": [{**FUNCTION_TOOL, "description": "The weather in a city"}]}  # fmt: skip
    counted = client.responses.input_tokens.count(**fields)
    created = client.responses.create(**fields, max_output_tokens=3, temperature=0)
    assert counted.input_tokens == created.usage.input_tokens
    assert counted.input_tokens > client.responses.input_tokens.count(model=E2E_MODEL, input="hi").input_tokens
    assert httpx.get(f"{base}/version").json() == {"version": importlib.metadata.version("decoda")}
