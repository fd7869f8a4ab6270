"""``/v1/messages`` and ``/v1/messages/count_tokens`` against the in-process fake engine: the body's
translation (tools, tool_choice, stop_sequences, HF knobs), the conversation as the chat template gets
it, the message's shape, the streamed events' order, Anthropic's error shape on every refusal (the
middlewares' included), and ``x-api-key`` auth."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from decoding import FinishReason, RequestOutput, SequenceDelta
from server.api.messages.protocol import MessagesRequest
from tests.fake_engine import FakeEngineClient
from tests.test_api import MODEL, client_for, run
from tests.test_responses_api import RecordingEngine

MESSAGES, COUNT = "/v1/messages", "/v1/messages/count_tokens"
HELLO = [{"role": "user", "content": "hello world"}]
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip
EPHEMERAL = {"type": "ephemeral"}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


class StoppingEngine(RecordingEngine):
    """Replies ``reply`` and ends as a stop string ended it (``stop_reason``)."""

    def __init__(self, reply: str, stopped_by: str) -> None:
        super().__init__(reply)
        self.stopped_by = stopped_by

    async def _scripted(self, request_id: str, prompt_ids: list[int]) -> AsyncIterator[RequestOutput]:
        delta = SequenceDelta(0, self.reply or "", [1], None, FinishReason.STOP, stop_reason=self.stopped_by)
        yield RequestOutput(request_id, [delta], len(prompt_ids), 1, finished=True)


def call(engine: FakeEngineClient, path: str, body: dict, headers: dict | None = None,
         **settings: object) -> httpx.Response:  # fmt: skip
    async def go() -> httpx.Response:
        async with client_for(engine, **settings) as http:
            return await http.post(path, json=body, headers=headers)

    return run(go())


def message(engine: FakeEngineClient, **body: object) -> dict:
    response = call(engine, MESSAGES, {"model": MODEL, "max_tokens": 3, "messages": HELLO, **body})
    assert response.status_code == 200, response.text
    return response.json()


def events(text: str) -> list[tuple[str, dict]]:
    """(the SSE ``event:`` name, the payload) of each event; the name is always the payload's type."""
    out, name = [], None
    for line in text.splitlines():
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            payload = json.loads(line[len("data: ") :])
            assert name == payload["type"]
            out.append((name, payload))
    return out


def anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    """The message of an error in Anthropic's shape, and nothing else in the body."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body) == {"type", "error"}
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == kind
    return body["error"]["message"]


# ---- the message ------------------------------------------------------------------------------------
def test_a_message_has_anthropics_shape():
    body = message(FakeEngineClient())
    assert body["id"].startswith("msg_") and body["type"] == "message" and body["role"] == "assistant"
    assert body["model"] == MODEL and body["content"] == [{"type": "text", "text": "hello world foo"}]
    assert body["stop_reason"] == "max_tokens" and body["stop_sequence"] is None
    assert body["usage"] == {"input_tokens": 3, "output_tokens": 3, "cache_read_input_tokens": 0,
                             "cache_creation_input_tokens": 0}  # fmt: skip


def test_a_stop_sequence_ends_the_message_and_is_named():
    engine = StoppingEngine("hello", "###")
    body = message(engine, stop_sequences=["###"])
    assert body["stop_reason"] == "stop_sequence" and body["stop_sequence"] == "###"
    (_, _, params) = engine.submitted[0]
    assert params.stop == ["###"]  # chat's stop: trimmed from the reply, as Anthropic's
    eos = message(StoppingEngine("hello", 0))  # an eos token id
    assert eos["stop_reason"] == "end_turn" and eos["stop_sequence"] is None


def test_hf_knobs_are_extra_fields_as_on_chat():
    engine = RecordingEngine()
    message(engine, temperature=0, num_beams=2, length_penalty=0.5, no_repeat_ngram_size=3)
    (_, _, params) = engine.submitted[0]
    assert (params.num_beams, params.length_penalty, params.no_repeat_ngram_size, params.do_sample) == (2, 0.5, 3,
                                                                                                          False)
    engine = RecordingEngine()
    message(engine, temperature=0, penalty_alpha=0.6, top_k=4)
    assert (engine.submitted[0][2].penalty_alpha, engine.submitted[0][2].top_k) == (0.6, 4)


def test_the_conversation_reaches_the_template_as_chats_messages():
    engine = RecordingEngine()
    conversation = [
        {"role": "user", "content": [{"type": "text", "text": "weather in "}, {"type": "text", "text": "Oslo?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3 C"},
                                     {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                                      "content": [{"type": "text", "text": "no such city"}]},
                                     {"type": "text", "text": "and tomorrow?", "cache_control": EPHEMERAL}]},
    ]  # fmt: skip
    message(engine, system=[{"type": "text", "text": "Be brief. "}, {"type": "text", "text": "Use C."}],
            messages=conversation, tools=[WEATHER])  # fmt: skip
    messages, tools = engine.templates[0]
    assert messages == [
        {"role": "system", "content": "Be brief. Use C."},
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "3 C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no such city"},
        {"role": "user", "content": "and tomorrow?"},
    ]  # fmt: skip
    assert tools == [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                       "parameters": WEATHER["input_schema"]}}]  # fmt: skip


@pytest.mark.parametrize(("choice", "expected", "parallel"), [
    ({"type": "auto"}, "auto", True),
    ({"type": "any"}, "required", True),
    ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
    ({"type": "tool", "name": "get_weather"}, "get_weather", True),
    ({"type": "none"}, "none", True),
])  # fmt: skip
def test_tool_choice_is_chats(choice, expected, parallel):
    body = MessagesRequest.model_validate({"max_tokens": 3, "messages": HELLO, "tools": [WEATHER],
                                           "tool_choice": choice})  # fmt: skip
    tool_use = body.tool_use()
    named = getattr(tool_use.choice, "function", None)
    assert (named.name if named else tool_use.choice) == expected and tool_use.parallel is parallel
    assert (body.template_tools() is None) is (expected == "none")


@pytest.mark.parametrize(("choice", "chat_choice"), [
    ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}),
    ({"type": "any", "disable_parallel_tool_use": True}, "required"),
    ({"type": "auto"}, "auto"),
])  # fmt: skip
def test_the_reply_is_constrained_by_chats_call_grammar(choice, chat_choice):
    engine = RecordingEngine()
    message(engine, tools=[WEATHER], tool_choice=choice)
    chat_tool = {"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                                  "parameters": WEATHER["input_schema"]}}  # fmt: skip
    chat_body = {"messages": HELLO, "max_tokens": 3, "tools": [chat_tool], "tool_choice": chat_choice,
                 "parallel_tool_calls": choice.get("disable_parallel_tool_use") is not True}  # fmt: skip
    assert call(engine, "/v1/chat/completions", chat_body).status_code == 200
    grammar, chat_grammar = (submitted[2].structured_output for submitted in engine.submitted)
    assert grammar is not None and grammar == chat_grammar


def test_a_tool_call_is_a_tool_use_block():
    body = message(RecordingEngine("Checking.\n" + CALL), tools=[WEATHER])
    text, tool_use = body["content"]
    assert text == {"type": "text", "text": "Checking.\n"}
    assert tool_use["type"] == "tool_use" and tool_use["id"].startswith("toolu_")
    assert (tool_use["name"], tool_use["input"]) == ("get_weather", {"city": "Oslo"})
    assert body["stop_reason"] == "tool_use"
    calls_only = message(RecordingEngine(CALL + "\n" + CALL), tools=[WEATHER])
    assert [block["type"] for block in calls_only["content"]] == ["tool_use", "tool_use"]  # no whitespace text


def test_without_tools_a_call_tag_is_text():
    body = message(RecordingEngine(CALL))
    assert body["content"] == [{"type": "text", "text": CALL}] and body["stop_reason"] == "end_turn"


# ---- the stream -------------------------------------------------------------------------------------
def test_the_stream_sends_anthropics_events_in_order():
    response = call(FakeEngineClient(), MESSAGES, {"max_tokens": 3, "messages": HELLO, "stream": True})
    sent = events(response.text)
    assert [name for name, _ in sent] == ["message_start", "ping", "content_block_start", "content_block_delta",
                                          "content_block_delta", "content_block_delta", "content_block_stop",
                                          "message_delta", "message_stop"]  # fmt: skip
    start = sent[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] == 3
    assert "".join(p["delta"]["text"] for n, p in sent if n == "content_block_delta") == "hello world foo"
    assert sent[-2][1] == {"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                           "usage": {"input_tokens": 3, "output_tokens": 3, "cache_read_input_tokens": 0,
                                     "cache_creation_input_tokens": 0}}  # fmt: skip
    assert "[DONE]" not in response.text


def test_a_streamed_call_is_a_tool_use_block_with_its_json():
    body = {"max_tokens": 3, "messages": HELLO, "stream": True, "tools": [WEATHER]}
    sent = events(call(RecordingEngine("Checking. " + CALL), MESSAGES, body).text)
    blocks = [(n, p.get("index"), p.get("content_block") or p.get("delta")) for n, p in sent if "index" in p]
    assert [(n, i) for n, i, _ in blocks] == [("content_block_start", 0), ("content_block_delta", 0),
                                              ("content_block_stop", 0), ("content_block_start", 1),
                                              ("content_block_delta", 1), ("content_block_stop", 1)]  # fmt: skip
    start, delta = blocks[3][2], blocks[4][2]
    assert start["type"] == "tool_use" and start["name"] == "get_weather" and start["input"] == {}
    assert delta["type"] == "input_json_delta" and json.loads(delta["partial_json"]) == {"city": "Oslo"}
    assert sent[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_a_failed_stream_ends_with_an_error_event():
    body = {"max_tokens": 3, "messages": HELLO, "stream": True}
    sent = events(call(FakeEngineClient(fail=True), MESSAGES, body).text)
    assert [name for name, _ in sent] == ["error"]
    assert sent[0][1]["error"]["type"] == "api_error" and "boom" in sent[0][1]["error"]["message"]


# ---- count_tokens -----------------------------------------------------------------------------------
def test_count_tokens_counts_the_messages_prompt():
    conversation = {"system": "the end", "messages": HELLO, "tools": [WEATHER]}
    counted = call(RecordingEngine(), COUNT, conversation)
    assert counted.status_code == 200 and counted.json() == {"input_tokens": 5}
    created = message(RecordingEngine(), **conversation)
    assert created["usage"]["input_tokens"] + created["usage"]["cache_read_input_tokens"] == 5
    missing = call(FakeEngineClient(), COUNT, {"messages": HELLO, "max_tokens": 3})
    assert "max_tokens" in anthropic_error(missing, 400, "invalid_request_error")


# ---- refusals, in Anthropic's shape -----------------------------------------------------------------
@pytest.mark.parametrize(("extra", "named"), [
    ({"max_tokens": None}, "max_tokens"),
    ({"num_beam": 2}, "num_beam"),
    ({"stop": ["x"]}, "stop_sequences"),
    ({"user": "ada"}, "metadata.user_id"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"n": 2}, "n must be 1"),
    ({"return_token_ids": True}, "return_token_ids"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "thinking", "thinking": "", "signature": ""}]}]},
     "messages[0].content[0]"),
    ({"messages": HELLO + [{"role": "assistant", "content": "The answer is"}]}, "prefill"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
     "only an assistant turn"),
    ({"messages": []}, "messages must not be empty"),
    ({"tool_choice": {"type": "tool", "name": "other"}, "tools": [WEATHER]}, "tool_choice"),
    ({"stop_sequences": [""]}, "stop"),
])  # fmt: skip
def test_refusals_are_400s_naming_the_field(extra, named):
    body = {"model": MODEL, "max_tokens": 3, "messages": HELLO, **extra}
    body = {k: v for k, v in body.items() if v is not None}
    assert named in anthropic_error(call(RecordingEngine(), MESSAGES, body), 400, "invalid_request_error")


def test_disabled_thinking_and_hints_are_accepted():
    body = message(FakeEngineClient(), thinking={"type": "disabled"}, metadata={"user_id": "u-1"},
                   service_tier="auto", cache_control=EPHEMERAL)  # fmt: skip
    assert body["content"]


def test_every_status_answers_in_anthropics_shape():
    assert "'nope'" in anthropic_error(call(FakeEngineClient(), MESSAGES, {"model": "nope", "max_tokens": 3,
                                                                          "messages": HELLO}), 404, "not_found_error")
    anthropic_error(call(FakeEngineClient(), "/v1/messages/nowhere", {}), 404, "not_found_error")
    anthropic_error(call(FakeEngineClient(queue_full=True), MESSAGES, {"max_tokens": 3, "messages": HELLO}), 429,
                    "rate_limit_error")  # fmt: skip
    big = {"max_tokens": 3, "messages": [{"role": "user", "content": "x" * 5000}]}
    too_large = call(FakeEngineClient(), MESSAGES, big, max_request_bytes=1000)  # the limits middleware's answer
    assert int(too_large.headers["content-length"]) == len(too_large.content)
    anthropic_error(too_large, 413, "request_too_large")
    loading = call(None, MESSAGES, {"max_tokens": 3, "messages": HELLO})  # type: ignore[arg-type]
    anthropic_error(loading, 503, "overloaded_error")
    assert "Retry-After" in loading.headers
    chat = call(FakeEngineClient(), "/v1/chat/completions", {"messages": HELLO, "num_beam": 2})
    assert set(chat.json()["error"]) == {"message", "type", "param", "code"}  # other APIs keep OpenAI's shape


# ---- auth ---------------------------------------------------------------------------------------------
def test_x_api_key_is_a_key_everywhere():
    body = {"max_tokens": 3, "messages": HELLO}
    ok = call(FakeEngineClient(), MESSAGES, body, {"x-api-key": "k1", "anthropic-version": "2023-06-01"},
              api_key="k1")  # fmt: skip
    assert ok.status_code == 200
    assert call(FakeEngineClient(), MESSAGES, body, {"Authorization": "Bearer k1"}, api_key="k1").status_code == 200
    wrong = call(FakeEngineClient(), MESSAGES, body, {"x-api-key": "k2"}, api_key="k1")
    assert "x-api-key" in anthropic_error(wrong, 401, "authentication_error")
    chat = call(FakeEngineClient(), "/v1/chat/completions", {"messages": HELLO, "max_tokens": 1},
                {"x-api-key": "k1"}, api_key="k1")  # fmt: skip
    assert chat.status_code == 200

    async def docs(headers: dict) -> int:  # a path the ProtectPaths middleware guards
        async with client_for(FakeEngineClient(), api_key="k1") as http:
            return (await http.get("/openapi.json", headers=headers)).status_code

    assert (run(docs({"x-api-key": "k1"})), run(docs({"x-api-key": "no"}))) == (200, 401)


def test_the_contract_documents_anthropics_errors():
    async def spec() -> dict:
        async with client_for(FakeEngineClient()) as http:
            return (await http.get("/openapi.json")).json()

    doc = run(spec())
    for path in (MESSAGES, COUNT):
        responses = doc["paths"][path]["post"]["responses"]
        assert "422" not in responses and {"400", "401", "404", "413", "429", "500", "503"} <= set(responses)
        assert responses["400"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/MessagesErrorResponse"}
        assert "Retry-After" in responses["503"]["headers"]
    request = doc["components"]["schemas"]["MessagesRequest"]
    assert {"max_tokens", "messages"} <= set(request["required"])


def test_a_bad_knob_is_a_400_before_the_template_runs():
    engine = RecordingEngine()
    response = call(engine, MESSAGES, {"max_tokens": 3, "messages": HELLO, "temperature": 1, "top_p": 1.5})
    assert "top_p" in anthropic_error(response, 400, "invalid_request_error") and engine.templates == []


def test_output_config_format_is_chats_json_schema():
    """Anthropic's structured outputs take chat's json_schema path: the same grammar as the chat request."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    engine = RecordingEngine()
    message(engine, output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"})
    chat_body = {"messages": HELLO, "max_tokens": 3,
                 "response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}}
    assert call(engine, "/v1/chat/completions", chat_body).status_code == 200
    ours, chat = (submitted[2].structured_output for submitted in engine.submitted)
    assert ours is not None and ours.param == "output_config.format" and (ours.kind, ours.value) == (chat.kind,
                                                                                                      chat.value)
    both = call(engine, MESSAGES, {"model": MODEL, "max_tokens": 3, "messages": HELLO, "response_format": {
        "type": "json_object"}, "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    assert both.status_code == 400 and "output_config.format" in both.json()["error"]["message"]
