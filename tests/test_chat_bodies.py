"""Chat bodies that real clients send (the ``openai`` SDK, langchain, instructor, agents): every field
OpenAI defines is honoured, accepted as the hint it is, or a 400 naming it; nested errors name their
path; legacy function calling reads as tools. Against the in-process fake engine."""

from __future__ import annotations

import pytest
from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageFunctionToolCall
from openai.types.chat.chat_completion_message_function_tool_call import Function

from decoding import GenerationParams
from server.api.chat.protocol import ChatCompletionRequest
from tests.fake_engine import FakeEngineClient
from tests.test_api import MODEL, error_of, post, run

CHAT = "/v1/chat/completions"
ASK = {"role": "user", "content": "hello world"}
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip


class RecordingEngine(FakeEngineClient):
    """The fake engine, keeping what the chat template got and accepting any constraint."""

    def __init__(self) -> None:
        super().__init__()
        self.templates: list[tuple[list[dict], list[dict] | None]] = []

    async def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        self.templates.append((messages, tools))
        return await super().apply_chat_template(messages, tools)

    async def compile_structured_output(self, params: GenerationParams) -> GenerationParams:
        return params


def chat(body: dict, engine: FakeEngineClient | None = None):  # noqa: ANN201
    return run(post(engine or FakeEngineClient(), CHAT, {"model": MODEL, "max_tokens": 2, **body}))


def rendered(body: dict) -> tuple[list[dict], list[dict] | None]:
    """What the chat template got for ``body`` (which must be served)."""
    engine = RecordingEngine()
    response = chat(body, engine)
    assert response.status_code == 200, response.text
    return engine.templates[-1]


def refused(body: dict) -> dict:
    response = chat(body)
    assert response.status_code == 400, response.text
    return error_of(response)


# ---- messages as clients replay them -----------------------------------------------------------------
def test_a_reply_replayed_from_the_openai_sdk_is_the_next_turn():
    reply = ChatCompletionMessage(role="assistant", content="hi").model_dump()
    assert {"refusal", "annotations", "audio", "function_call", "tool_calls"} <= set(reply)  # all null
    messages, _ = rendered({"messages": [ASK, reply, ASK]})
    assert messages[1] == {"role": "assistant", "content": "hi"}


def test_a_tool_calling_reply_from_the_sdk_renders_its_calls():
    call = ChatCompletionMessageFunctionToolCall(
        id="call_1", type="function", function=Function(name="get_weather", arguments='{"city": "Oslo"}')
    )
    reply = ChatCompletionMessage(role="assistant", content=None, tool_calls=[call]).model_dump()
    result = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    messages, _ = rendered({"messages": [ASK, reply, result]})
    assert messages[1]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    ]


def test_a_refusal_is_the_turns_text_and_only_an_assistant_refuses():
    turn = {"role": "assistant", "content": None, "refusal": "I cannot help with that"}
    messages, _ = rendered({"messages": [ASK, turn, ASK]})
    assert messages[1]["content"] == "I cannot help with that"
    parts = {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}
    assert rendered({"messages": [ASK, parts, ASK]})[0][1]["content"] == "no"
    error = refused({"messages": [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}]})
    assert error["param"] == "messages" and "messages[0]: only an assistant" in error["message"]


def test_a_message_with_audio_is_refused_naming_it():
    reply = {**ChatCompletionMessage(role="assistant", content="hi").model_dump(), "audio": {"id": "audio_1"}}
    error = refused({"messages": [ASK, reply]})
    assert error["param"] == "messages[1].audio" and "text-only" in error["message"]


def test_a_message_name_reaches_the_template():
    messages, _ = rendered({"messages": [{**ASK, "name": "alice"}, {"role": "system", "content": "hi"}]})
    assert messages[0]["name"] == "alice" and "name" not in messages[1]


def test_text_parts_may_carry_prompt_cache_hints():
    part = {"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}}
    marked = {"type": "text", "text": " world", "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "30m"}}
    messages, _ = rendered({"messages": [{"role": "user", "content": [part, marked]}]})
    assert messages[0]["content"] == "hello world"


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "file", "file": {"file_id": "file-1"}},
    ],
)
def test_image_audio_and_file_parts_are_refused_at_their_path(part):
    """A text-only model takes no image (tests/test_api_images.py: one that does); no model takes audio or files."""
    error = refused({"messages": [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, part]}]})
    assert error["param"] == "messages[0].content[1]"
    assert error["message"].startswith("messages[0].content[1]: ")
    if part["type"] == "image_url":
        assert "model 'fake-model' does not take images" in error["message"]
    else:
        assert part["type"] in error["message"] and "not audio or files" in error["message"]


@pytest.mark.parametrize("part", [{"type": "video", "video": "x"}, {"type": {}}, {"text": "no type"}, 5])
def test_an_unknown_part_type_is_named_by_its_path(part):
    error = refused({"messages": [ASK, {"role": "user", "content": [part]}]})
    assert error["param"] == "messages[1].content[0]" and "'text'" in error["message"]


# ---- errors name the nested field ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"messages": [ASK, {"role": "user", "content": [{"type": "text", "text": "x", "foo": 1}]}]},
         "messages[1].content[0].foo"),
        ({"messages": [{**ASK, "foo": 1}]}, "messages[0].foo"),
        ({"messages": [ASK], "tools": [{"type": "function", "function": {**WEATHER, "foo": 1}}]},
         "tools[0].function.foo"),
        ({"messages": [ASK], "response_format": {"type": "json_schema", "json_schema": {"name": "a", "foo": 1}}},
         "response_format.json_schema.foo"),
        ({"messages": [ASK], "stream_options": {"include_usage": True, "foo": 1}}, "stream_options.foo"),
    ],
)  # fmt: skip
def test_a_nested_unknown_field_is_named_by_its_path(body, path):
    error = refused(body)
    assert (error["param"], error["code"]) == (path, "unknown_field")
    assert error["message"] == f"Unrecognized request argument supplied: {path}"


@pytest.mark.parametrize(
    ("body", "param"),
    [({"top_p": "x"}, "top_p"), ({"stop": 5}, "stop"), ({"tool_choice": "sometimes"}, "tool_choice"),
     ({"logit_bias": {"50256": "x"}}, "logit_bias"), ({"num_beam": 2}, "num_beam")],
)  # fmt: skip
def test_a_top_level_error_still_names_the_field_alone(body, param):
    error = refused({"messages": [ASK], **body})
    assert error["param"] == param
    assert error["message"].startswith(f"{param}: ") or error["message"].endswith(f"supplied: {param}")


def test_a_json_schema_without_name_names_the_name():
    error = refused({"messages": [ASK], "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}})
    assert error["param"] == "response_format.json_schema.name"
    assert error["message"] == "missing required field: response_format.json_schema.name"


@pytest.mark.parametrize(
    ("body", "path", "value"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "my schema", "schema": {}}}},
         "response_format.json_schema.name", "my schema"),
        ({"tools": [{"type": "function", "function": {**WEATHER, "name": "weather.get"}}]},
         "tools[0].function.name", "weather.get"),
        ({"tools": [{"type": "function", "function": WEATHER}],
          "tool_choice": {"type": "function", "function": {"name": "x" * 65}}}, "tool_choice.function.name", "x" * 65),
        ({"functions": [{"name": ""}]}, "functions[0].name", ""),
        ({"functions": [WEATHER], "function_call": {"name": "get weather"}}, "function_call.name", "get weather"),
    ],
)  # fmt: skip
def test_names_follow_openais_pattern(body, path, value):
    error = refused({"messages": [ASK], **body})
    assert error["param"] == path
    assert "^[a-zA-Z0-9_-]{1,64}$" in error["message"] and f'"{value}"' in error["message"]


# ---- OpenAI's other top-level fields ------------------------------------------------------------------
HINTS = {
    "store": True, "metadata": {"user_tier": "gold"}, "service_tier": "flex", "prompt_cache_key": "conversation-7",
    "prompt_cache_retention": "24h", "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
    "safety_identifier": "user-42", "verbosity": "low", "reasoning_effort": "minimal", "modalities": ["text"],
    "stream_options": {"include_usage": True, "include_obfuscation": False}, "audio": None,
    "web_search_options": None, "moderation": None,
}  # fmt: skip


def test_openais_hints_are_accepted_and_change_nothing_generated():
    engine = FakeEngineClient()
    plain = chat({"messages": [ASK], "stream_options": {"include_usage": True}}, engine)
    hinted = chat({"messages": [ASK], **HINTS}, engine)
    assert (plain.status_code, hinted.status_code) == (200, 200), hinted.text
    (_, plain_ids, plain_params), (_, hinted_ids, hinted_params) = engine.submitted
    # safety_identifier names the end user: on a server without keys it is the fair-share line the request
    # waits in (server/translate/scheduling.py), and nothing else about what is generated
    assert hinted_params.caller == "user:user-42" and plain_params.caller == ""
    assert (hinted_ids, hinted_params.replace(caller="")) == (plain_ids, plain_params)
    assert chat({"messages": [ASK], "store": False}).status_code == 200


def test_a_prediction_is_the_draft_prompt_lookup_searches_first():
    engine = FakeEngineClient()
    prediction = {"type": "content", "content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}
    assert chat({"messages": [ASK], "prediction": prediction}, engine).status_code == 200
    ((_, _, params),) = engine.submitted
    assert params.prompt_lookup_num_tokens == 10 and params.prediction is None
    assert params.prediction_ids and params.prediction_ids == engine._words("hello world")
    error = refused({"messages": [ASK], "prediction": prediction, "num_beams": 2})
    assert error["param"] == "prediction" and "num_beams" in error["message"]


@pytest.mark.parametrize(
    ("metadata", "words"),
    [
        ({f"k{i}": "v" for i in range(17)}, "at most 16 pairs, got 17"),
        ({"k" * 65: "v"}, "keys are at most 64 characters"),
        ({"note": "v" * 513}, "values are at most 512 characters; 'note' has 513"),
    ],
)
def test_metadata_is_held_to_openais_limits(metadata, words):
    error = refused({"messages": [ASK], "metadata": metadata})
    assert error["param"] == "metadata" and words in error["message"]
    assert refused({"messages": [ASK], "metadata": {"count": 3}})["param"] == "metadata.count"


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("audio", {"voice": "alloy", "format": "mp3"}, "does not support audio output"),
        ("modalities", ["text", "audio"], "text-only"),
        ("web_search_options", {"search_context_size": "low"}, "does not support web search"),
        ("moderation", {"model": "omni-moderation-latest"}, "does not support moderation"),
    ],
)
def test_what_a_text_only_model_cannot_do_is_refused_naming_the_field(field, value, words):
    error = refused({"messages": [ASK], field: value})
    assert error["param"] == field and error["message"].startswith(f"{field}: ") and words in error["message"]


# ---- legacy function calling --------------------------------------------------------------------------
def test_legacy_functions_are_tools_and_function_call_the_tool_choice():
    _, tools = rendered({"messages": [ASK], "functions": [WEATHER], "function_call": {"name": "get_weather"}})
    assert tools == [{"type": "function", "function": WEATHER}]
    body = ChatCompletionRequest(messages=[ASK], functions=[WEATHER], function_call={"name": "get_weather"})
    tool_use = body.tool_use()
    assert tool_use is not None and tool_use.choice.function.name == "get_weather"
    assert tool_use.parallel is False  # one call per reply, as the legacy API returned
    assert ChatCompletionRequest(messages=[ASK], functions=[WEATHER]).tool_use().choice is None  # "auto"
    assert rendered({"messages": [ASK], "functions": [WEATHER], "function_call": "none"})[1] is None


def test_a_legacy_function_call_and_its_result_render_as_a_tool_call_and_result():
    call = {"role": "assistant", "content": None, "function_call": {"name": "get_weather", "arguments": "{}"}}
    result = {"role": "function", "name": "get_weather", "content": "sunny"}
    messages, _ = rendered({"messages": [ASK, call, result], "functions": [WEATHER]})
    assert messages[1]["tool_calls"] == [{"type": "function", "function": {"name": "get_weather", "arguments": {}}}]
    assert messages[2] == {"role": "tool", "name": "get_weather", "content": "sunny"}
    error = refused({"messages": [ASK, call, {"role": "function", "content": "sunny"}]})
    assert "messages[2]: a function message needs" in error["message"]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"functions": [WEATHER], "tools": [{"type": "function", "function": WEATHER}]}, "functions", "not both"),
        ({"function_call": "auto", "tool_choice": "auto"}, "function_call", "not both"),
        ({"functions": [WEATHER], "tool_choice": "required"}, "functions", "got functions with tool_choice"),
        ({"functions": [WEATHER], "parallel_tool_calls": True}, "functions", "not both"),
        ({"functions": [WEATHER], "function_call": {"name": "get_time"}}, "function_call", "'get_time'"),
        ({"function_call": "auto"}, "function_call", "needs functions"),
        ({"functions": [WEATHER, WEATHER]}, "functions", "unique"),
    ],
)
def test_legacy_function_errors_name_the_legacy_fields(body, param, words):
    error = refused({"messages": [ASK], **body})
    assert error["param"] == param and words in error["message"], error


def test_chat_template_kwargs_reach_the_template_and_the_servers_own_names_are_refused():
    engine = FakeEngineClient()
    response = chat({"messages": [{"role": "user", "content": "hi"}],
                     "chat_template_kwargs": {"enable_thinking": False, "custom": [1, 2]}}, engine)  # fmt: skip
    assert response.status_code == 200, response.text
    assert engine.template_kwargs == {"enable_thinking": False, "custom": [1, 2]}
    hello = [{"role": "user", "content": "hi"}]
    assert refused({"messages": hello, "chat_template_kwargs": {"tools": []}})["param"] == "chat_template_kwargs.tools"
    assert refused({"messages": hello, "chat_template_kwargs": {"not a name": 1}})["param"] == "chat_template_kwargs"
    assert refused({"messages": hello, "chat_template_kwargs": [1]})["param"] == "chat_template_kwargs"
