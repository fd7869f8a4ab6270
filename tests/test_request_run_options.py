"""The top-level fields the SDKs' create params define about how a request is run (issue 50).

``tests/test_sdk_type_fields.py`` walks every top-level field of the four APIs' create params (and
both count params) null and set; these tests hold what each one does: the Responses API's
``max_tool_calls`` is honoured (the call grammar lets a reply make at most that many calls), the
hints change nothing generated, the fields that ask for what is not served are 400s naming them, and
null stands for a field's default (``n``, ``stream``, ``logprobs``...), as ``/openapi.json`` says.
"""

from __future__ import annotations

import anthropic
import httpx2
import pytest

from server.output.tool_formats import FORMATS
from server.translate.tools import Tool, call_grammar
from tests.fake_engine import FakeEngineClient
from tests.test_api import MODEL, error_of, post, run
from tests.test_responses_api import RecordingEngine, Server
from tests.test_sdk_type_fields import ANTHROPIC_TOOL, FUNCTION_TOOL, HELLO, get, openai_client
from tests.test_tool_formats import NOW, OSLO, TIME, WEATHER, accepts, written  # noqa: F401 (accepts: a fixture)

TIME_TOOL = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}


# ---- max_tool_calls -------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", list(FORMATS))
def test_max_tool_calls_is_the_most_calls_the_grammar_lets_a_reply_make(name, accepts):  # noqa: F811
    """OpenAI: "further attempts to call a tool will be ignored": here they cannot be written."""
    tools, three = [WEATHER, TIME], [OSLO, NOW, OSLO]
    for choice in ("required", "auto"):
        capped = call_grammar(tools, choice, parallel=True, tool_format=name, max_calls=2)
        assert accepts(capped, written(name, three[:1])) and accepts(capped, written(name, three[:2]))
        assert not accepts(capped, written(name, three))
        assert accepts(call_grammar(tools, choice, parallel=True, tool_format=name), written(name, three))
        one = call_grammar(tools, choice, parallel=True, tool_format=name, max_calls=1)
        assert accepts(one, written(name, three[:1])) and not accepts(one, written(name, three[:2]))
    assert call_grammar(tools, "auto", parallel=True, tool_format=name, max_calls=0) is None


def test_a_responses_max_tool_calls_caps_the_call_grammar_and_is_echoed(tmp_path):
    server = Server(tmp_path)
    body = server.create({"input": "hello", "tools": [FUNCTION_TOOL, TIME_TOOL], "max_tool_calls": 2})
    assert body["max_tool_calls"] == 2
    tools = [Tool.model_validate({"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}})
             for tool in (FUNCTION_TOOL, TIME_TOOL)]  # fmt: skip
    sent = server.engine.submitted[-1][2].structured_output
    assert sent == call_grammar(tools, None, parallel=True, max_calls=2)
    assert sent != call_grammar(tools, None, parallel=True)
    required = {"input": "hello", "tools": [FUNCTION_TOOL], "tool_choice": "required", "max_tool_calls": 3}
    server.create(required)
    assert server.engine.submitted[-1][2].structured_output == call_grammar(tools[:1], "required", True, max_calls=3)
    assert server.create({"input": "hello", "tools": [FUNCTION_TOOL]})["max_tool_calls"] is None


def test_max_tool_calls_0_makes_no_call_and_cannot_meet_a_forced_one(tmp_path):
    server = Server(tmp_path)
    server.create({"input": "hello", "tools": [FUNCTION_TOOL], "max_tool_calls": 0})
    assert server.engine.templates[-1][1] is None  # the tools are not offered: no call can be made
    assert server.engine.submitted[-1][2].structured_output is None
    for body in ({"tool_choice": "required", "max_tool_calls": 0}, {"max_tool_calls": -1}):
        response = server.call("POST", "/v1/responses", {"input": "hello", "tools": [FUNCTION_TOOL], **body})
        assert response.status_code == 400 and error_of(response)["param"] == "max_tool_calls", response.text


# ---- refused: what is not served -------------------------------------------------------------------------
@pytest.mark.parametrize(("field", "value", "param"), [
    ("prompt", {"id": "pmpt_1", "version": "2", "variables": {"city": "Oslo"}}, "prompt"),
    ("moderation", {"model": "omni-moderation-latest", "policy": {"input": {"mode": "block"}}}, "moderation"),
    ("context_management", [{"type": "compaction", "compact_threshold": 1000}], "context_management[0]"),
    ("access_programs", {"cyber": "daybreak_red"}, "access_programs.cyber"),
    ("image", {"context_compression": "enabled"}, "image.context_compression"),
    ("prompt_cache_options", {"prewarm": True}, "prompt_cache_options.prewarm"),
    ("include", ["reasoning.encrypted_content"], "include"),
])  # fmt: skip
def test_responses_fields_asking_for_what_is_not_served_are_400s_naming_them(tmp_path, field, value, param):
    response = Server(tmp_path).call("POST", "/v1/responses", {"input": "hello", field: value})
    assert response.status_code == 400, response.text
    assert error_of(response)["param"] == param and "not served" in error_of(response)["message"]


@pytest.mark.parametrize(("field", "value", "named"), [
    ("container", "container_011", "container"),
    ("container", {"id": None, "skills": [{"skill_id": "pptx", "type": "anthropic"}]}, "container"),
    ("diagnostics", {"previous_message_id": "msg_01"}, "diagnostics.previous_message_id"),
])  # fmt: skip
def test_messages_fields_asking_for_what_is_not_served_are_400s_naming_them(field, value, named):
    body = {"model": MODEL, "max_tokens": 1, "messages": [HELLO], field: value}
    response = run(post(FakeEngineClient(), "/v1/messages", body))
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert message.startswith(named) and "not served" in message


# ---- hints: accepted, nothing generated changes ---------------------------------------------------------
def submitted(engine: FakeEngineClient) -> list[tuple]:
    """What the engine was asked to run, without the request ids."""
    return [(prompt, params) for _, prompt, params in engine.submitted]


def test_responses_hints_change_nothing_generated(tmp_path):
    plain, hinted = Server(tmp_path / "a"), Server(tmp_path / "b")
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    body = {"input": "hello", "tools": [FUNCTION_TOOL]}
    plain.create(body)
    hints = {
        "background_options": {"completion_window": "8h", "continuation_id": "batch-7"},
        "access_programs": {"cyber": "standard"}, "image": {"context_compression": "disabled"},
        "prompt": None, "moderation": None, "context_management": [], "max_tool_calls": None, "stream": None,
        "prompt_cache_options": {"ttl": "12h", "comparison_response_id": "resp_1", "prewarm": False},
        "service_tier": "ultrafast",
    }  # fmt: skip
    hinted.create({**body, **hints})
    assert submitted(hinted.engine) == submitted(plain.engine)


def test_messages_hints_change_nothing_generated_or_counted():
    engine = RecordingEngine()
    body = {"model": MODEL, "max_tokens": 2, "messages": [HELLO], "tools": [ANTHROPIC_TOOL]}
    hints = {"speed": "fast", "inference_geo": "eu", "user_profile_id": "up_1", "workspace_id": "wrkspc_1"}
    assert run(post(engine, "/v1/messages", body)).status_code == 200
    given = {**body, **hints, "diagnostics": {"previous_message_id": None}, "container": None, "stream": None}
    assert run(post(engine, "/v1/messages", given)).status_code == 200
    first, second = submitted(engine)
    assert first == second
    counted = {k: v for k, v in body.items() if k != "max_tokens"}
    schema = {"type": "json_schema", "schema": {"type": "object"}}
    count = run(post(engine, "/v1/messages/count_tokens", counted)).json()
    count_hints = {k: v for k, v in hints.items() if k != "inference_geo"}  # not a field of the count's params
    also = run(
        post(engine, "/v1/messages/count_tokens", {**counted, **count_hints, "output_config": {"format": schema}})
    )
    assert also.status_code == 200 and also.json() == count


def test_the_sdks_send_the_top_level_fields_through_their_own_clients(tmp_path):
    """The real ``openai`` and ``anthropic`` clients, in process: the fields as keyword arguments (the
    anthropic SDK sends ``user_profile_id`` and ``workspace_id`` as headers)."""
    server = Server(tmp_path)
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=server.app), base_url="http://test")  # the SDK's
    messages = anthropic.AsyncAnthropic(base_url="http://test", api_key="unused", max_retries=0, http_client=http)

    async def go() -> None:
        response = await openai_client(server.app).responses.create(
            model=MODEL, input="hello", max_output_tokens=1, tools=[FUNCTION_TOOL], max_tool_calls=1,
            background_options={"completion_window": "soonest"}, access_programs={"cyber": "standard"},
            image={"context_compression": "auto"}, prompt=None, moderation=None, context_management=None,
        )  # fmt: skip
        assert response.max_tool_calls == 1 and response.object == "response"
        message = await messages.messages.create(
            model=MODEL, max_tokens=1, messages=[HELLO], speed="fast", inference_geo="us", user_profile_id="up_1",
            workspace_id="wrkspc_1", diagnostics={"previous_message_id": None}, container=None,
        )  # fmt: skip
        assert message.type == "message" and message.diagnostics is None
        counted = await messages.messages.count_tokens(model=MODEL, messages=[HELLO], speed="standard",
                                                       output_config={"effort": "low"})  # fmt: skip
        assert counted.input_tokens > 0
        with pytest.raises(anthropic.BadRequestError, match="container"):
            await messages.messages.create(model=MODEL, max_tokens=1, messages=[HELLO], container="container_011")

    run(go())


# ---- null: the field's default -----------------------------------------------------------------------
def test_null_stands_for_the_default_and_openapi_says_so():
    engine = RecordingEngine()
    chat = {"model": MODEL, "messages": [HELLO], "max_tokens": 2}
    nulls = {"n": None, "stream": None, "presence_penalty": None, "frequency_penalty": None, "logprobs": None,
             "stream_options": {"include_usage": None}}  # fmt: skip
    completion = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
    for path, body, given in (("/v1/chat/completions", chat, nulls), ("/v1/completions", completion, {"echo": None})):
        assert run(post(engine, path, body)).status_code == 200
        assert run(post(engine, path, {**body, **given})).status_code == 200
        first, second = submitted(engine)[-2:]
        assert first == second
    doc = run(get(engine, "/openapi.json")).json()
    schema = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"type": "null"} in schema["n"]["anyOf"] and schema["n"]["default"] == 1
    assert {"type": "null"} in schema["logprobs"]["anyOf"]
