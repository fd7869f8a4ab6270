"""``/v1/responses`` against the in-process fake engine: the body's translation, items to the chat
template's messages, the streamed events' order, the store's semantics (retrieve, delete, input
items, ``store: false``, continuing, a restart), isolation by API key, and errors naming fields."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from decoding import FinishReason, GenerationParams, RequestOutput, SequenceDelta
from server.api.responses.items import template_messages
from server.api.responses.store import page
from server.api.responses.truncation import droppable_units
from server.app import create_app
from server.config.settings import Settings
from tests.fake_engine import FakeEngineClient
from tests.test_api import error_of, run

RESPONSES = "/v1/responses"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip


class RecordingEngine(FakeEngineClient):
    """The fake engine, keeping what the chat template got and accepting any constraint; ``reply``
    (when set) is the whole text every request generates, in one delta."""

    def __init__(self, reply: str | None = None) -> None:
        super().__init__()
        self.templates: list[tuple[list[dict], list[dict] | None]] = []
        self.reply = reply

    async def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None,
                                  template_kwargs: dict | None = None) -> list[int]:  # fmt: skip
        self.templates.append((messages, tools))
        return await super().apply_chat_template(messages, tools, template_kwargs)

    async def compile_structured_output(self, params: GenerationParams) -> GenerationParams:
        return params

    def generate(self, request_id: str, prompt_ids: list[int], params: GenerationParams) -> AsyncIterator:
        if self.reply is None:
            return super().generate(request_id, prompt_ids, params)
        self.submitted.append((request_id, prompt_ids, params))
        return self._scripted(request_id, prompt_ids)

    async def _scripted(self, request_id: str, prompt_ids: list[int]) -> AsyncIterator[RequestOutput]:
        delta = SequenceDelta(0, self.reply, [1, 2], None, FinishReason.STOP)
        yield RequestOutput(request_id, [delta], len(prompt_ids), 2, finished=True)


class Server:
    """One app (one store file) driven through httpx; ``key`` is the bearer token it sends."""

    def __init__(self, tmp_path: Path, engine: FakeEngineClient | None = None, **settings: object) -> None:
        self.engine = engine or RecordingEngine()
        store = f"sqlite:///{tmp_path / 'responses.db'}"
        self.app = create_app(Settings(responses_store=store, **settings), engine_client=self.engine)

    def call(self, method: str, path: str, body: dict | None = None, key: str | None = None,
             **query: object) -> httpx.Response:  # fmt: skip
        async def go() -> httpx.Response:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers) as http:
                return await http.request(method, path, json=body, params=query or None)

        return run(go())

    def create(self, body: dict, key: str | None = None) -> dict:
        response = self.call("POST", RESPONSES, {"max_output_tokens": 2, **body}, key)
        assert response.status_code == 200, response.text
        return response.json()


@pytest.fixture
def server(tmp_path: Path) -> Server:
    return Server(tmp_path)


def sse_events(text: str) -> list[tuple[str, dict]]:
    """(the ``event:`` line, the data's JSON) of every event of a Responses stream."""
    events, name = [], None
    for line in text.splitlines():
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            events.append((name, json.loads(line[len("data: ") :])))
    return events


# ---- the body's translation -----------------------------------------------------------------------
def test_openai_fields_and_hf_knobs_reach_the_engine(server):
    server.create({"input": "hello", "max_output_tokens": 3, "temperature": 0.5, "top_p": 0.9, "seed": 7,
                   "top_k": 5, "repetition_penalty": 1.1})  # fmt: skip
    params = server.engine.submitted[-1][2]
    assert (params.max_new_tokens, params.temperature, params.top_p, params.seed) == (3, 0.5, 0.9, 7)
    assert (params.top_k, params.repetition_penalty) == (5, 1.1)


def test_max_output_tokens_and_max_tokens_are_one_knob(server):
    response = server.call("POST", RESPONSES, {"input": "hello", "max_output_tokens": 3, "max_new_tokens": 4})
    assert response.status_code == 400 and error_of(response)["param"] == "max_new_tokens"


def test_text_format_json_schema_is_chats_constraint_naming_text_format(server):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    server.create({"input": "hello", "text": {"format": {"type": "json_schema", "name": "city", "schema": schema,
                                                         "strict": True}}})  # fmt: skip
    constraint = server.engine.submitted[-1][2].structured_output
    assert constraint.kind == "json" and constraint.param == "text.format"
    assert constraint.value["additionalProperties"] is False  # strict: closed objects, as chat's
    server.create({"input": "hello", "text": {"format": {"type": "json_object"}}})
    assert server.engine.submitted[-1][2].structured_output.value == {"type": "object"}


def test_function_tools_reach_the_template_in_chats_shape(server):
    response = server.create({"input": "weather?", "tools": [WEATHER],
                              "tool_choice": {"type": "function", "name": "get_weather"}})  # fmt: skip
    _, tools = server.engine.templates[-1]
    assert tools == [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}]
    assert server.engine.submitted[-1][2].structured_output.kind == "grammar"  # the named call's grammar
    assert response["tools"][0]["name"] == "get_weather"
    assert response["tool_choice"] == {"type": "function", "name": "get_weather"}


def test_logprobs_with_include(server):
    body = server.create({"input": "hello", "include": ["message.output_text.logprobs"], "top_logprobs": 1})
    part = body["output"][0]["content"][0]
    assert [entry["token"] for entry in part["logprobs"]] == ["hello", "world"]
    assert part["logprobs"][0]["top_logprobs"][0]["token"] == "hello"
    assert "logprobs" not in server.create({"input": "hello"})["output"][0]["content"][0]


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "bogus": 1}, "bogus"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": "x", "background": True, "store": False}, "store"),
    ({"input": "x", "truncation": "middle"}, "truncation"),
    ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include"),
    ({"input": "x", "top_logprobs": 2}, "top_logprobs"),
    ({"input": "x", "n": 2}, "n"),
    ({"input": "x", "response_format": {"type": "json_object"}}, "response_format"),
    ({"input": []}, "input"),
    ({"input": [{"role": "user", "content": "x"}] * 2049}, "input"),
    ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format"),
])  # fmt: skip
def test_bad_fields_are_400s_naming_them(server, body, param):
    response = server.call("POST", RESPONSES, body)
    assert response.status_code == 400, response.text
    assert error_of(response)["param"].startswith(param)


# ---- items to messages ------------------------------------------------------------------------------
def test_items_become_chat_template_messages(server):
    items = [
        {"role": "developer", "content": "be terse"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather "},
                                                         {"type": "input_text", "text": "in Oslo?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "checking",
                                                              "annotations": []}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Bergen"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "3 C"},
    ]  # fmt: skip
    server.create({"instructions": "you are helpful", "input": items, "tools": [WEATHER]})
    messages, _ = server.engine.templates[-1]
    assert messages == [
        {"role": "system", "content": "you are helpful"},
        {"role": "system", "content": "be terse"},
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": "checking", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
            {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Bergen"}}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3 C"},
    ]  # fmt: skip


def test_a_function_call_without_a_message_before_it_is_its_own_assistant_turn():
    items = [{"id": "m", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
             {"id": "f", "type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]  # fmt: skip
    assert template_messages(None, items)[1] == {
        "role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
                                                            "function": {"name": "f", "arguments": {}}}]}  # fmt: skip


# ---- truncation --------------------------------------------------------------------------------------
def words(count: int, first: int = 0) -> str:
    """``count`` words the fake tokenizer reads as one token each."""
    return " ".join(f"w{i}" for i in range(first, first + count))


LONG_CONVERSATION = [  # 2 (instructions) + 20 + 1 + 0 + 20 + 10 + 10 + 1 (the template's end) = 64 tokens
    {"role": "user", "content": words(20)},
    {"role": "developer", "content": "x"},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_1", "output": words(20, 20)},
    {"role": "assistant", "content": words(10, 40)},
    {"role": "user", "content": words(10, 50)},
]  # fmt: skip


def test_truncation_auto_drops_the_oldest_whole_items_until_the_reply_fits(server):
    body = server.create({"instructions": "be brief", "input": LONG_CONVERSATION, "max_output_tokens": 30,
                          "truncation": "auto"})  # fmt: skip
    kept = [  # the call went with its output; the instructions and the developer turn stayed
        {"role": "system", "content": "be brief"}, {"role": "system", "content": "x"},
        {"role": "assistant", "content": words(10, 40)}, {"role": "user", "content": words(10, 50)},
    ]  # fmt: skip
    assert kept in [messages for messages, _ in server.engine.templates]
    prompt_ids = server.engine.submitted[-1][1]
    assert prompt_ids == [t for m in kept for t in server.engine._words(m["content"])] + [6]
    assert body["truncation"] == "auto" and body["usage"]["input_tokens"] == 24  # 24 + 30 <= 64; 44 + 30 is not
    listed = server.call("GET", f"{RESPONSES}/{body['id']}/input_items", order="asc").json()["data"]
    assert len(listed) == len(LONG_CONVERSATION)  # the stored input is the whole input


def test_truncation_disabled_keeps_a_conversation_that_does_not_fit_a_400(server):
    for truncation in ({}, {"truncation": "disabled"}):
        response = server.call("POST", RESPONSES, {"instructions": "be brief", "input": LONG_CONVERSATION,
                                                   "max_output_tokens": 30, **truncation})  # fmt: skip
        assert response.status_code == 400
        assert (error_of(response)["param"], error_of(response)["code"]) == ("input", "context_length_exceeded")


def test_truncation_auto_never_drops_the_newest_item(server):
    response = server.call("POST", RESPONSES, {"input": [{"role": "user", "content": words(70)}],
                                               "max_output_tokens": 2, "truncation": "auto"})  # fmt: skip
    assert response.status_code == 400 and error_of(response)["param"] == "input"


def test_droppable_units_keep_a_call_with_its_output_and_skip_system_turns():
    items = [{"id": "a", "type": "message", "role": "system", "content": []},
             {"id": "b", "type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
             {"id": "c", "type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
             {"id": "d", "type": "function_call_output", "call_id": "c2", "output": ""},
             {"id": "e", "type": "function_call_output", "call_id": "c1", "output": ""},
             {"id": "f", "type": "function_call_output", "call_id": "elsewhere", "output": ""},
             {"id": "g", "type": "message", "role": "user", "content": []}]  # fmt: skip
    assert droppable_units(items) == [[1, 4], [2, 3], [5], [6]]


# ---- output -----------------------------------------------------------------------------------------
def test_a_reply_cut_short_is_incomplete_with_usage(server):
    body = server.create({"input": "hello world", "max_output_tokens": 3})
    assert body["object"] == "response" and body["id"].startswith("resp_")
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    (message,) = body["output"]
    assert message["type"] == "message" and message["role"] == "assistant" and message["status"] == "incomplete"
    assert message["content"] == [{"type": "output_text", "text": "hello world foo", "annotations": []}]
    assert body["usage"]["input_tokens"] == 3 and body["usage"]["output_tokens"] == 3
    assert body["usage"]["total_tokens"] == 6 and body["usage"]["output_tokens_details"] == {"reasoning_tokens": 0}
    assert body["usage"]["input_tokens_details"]["cached_tokens"] == 0


CALL_REPLY = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def test_a_reply_that_calls_a_tool_has_a_function_call_item(tmp_path):
    server = Server(tmp_path, RecordingEngine(reply=CALL_REPLY))
    body = server.create({"input": "weather?", "tools": [WEATHER]})
    message, call = body["output"]
    assert body["status"] == "completed"
    assert message["content"][0]["text"] == "Let me check."
    assert call["type"] == "function_call" and call["name"] == "get_weather" and call["status"] == "completed"
    assert json.loads(call["arguments"]) == {"city": "Oslo"} and call["call_id"].startswith("call_")


def test_streamed_events_come_in_openais_order_with_sequence_numbers(tmp_path):
    server = Server(tmp_path, RecordingEngine(reply=CALL_REPLY))
    response = server.call("POST", RESPONSES, {"input": "weather?", "tools": [WEATHER], "stream": True})
    events = sse_events(response.text)
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert [name for name, _ in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    final = events[-1][1]["response"]
    assert final["output"][0]["content"][0]["text"] == "Let me check."
    assert json.loads(final["output"][1]["arguments"]) == {"city": "Oslo"}
    assert server.call("GET", f"{RESPONSES}/{final['id']}").json() == final  # stored before its last event


def test_a_stream_cut_short_ends_with_response_incomplete(server):
    response = server.call("POST", RESPONSES, {"input": "hello", "max_output_tokens": 3, "stream": True,
                                               "include": ["message.output_text.logprobs"]})  # fmt: skip
    events = sse_events(response.text)
    deltas = [data for name, data in events if name == "response.output_text.delta"]
    assert "".join(d["delta"] for d in deltas) == "hello world foo"
    assert sum(len(d["logprobs"]) for d in deltas) == 3
    assert events[-1][0] == "response.incomplete"
    assert events[-1][1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_failed_stream_ends_with_response_failed(tmp_path):
    engine = FakeEngineClient(fail=True)
    server = Server(tmp_path, engine)
    events = sse_events(server.call("POST", RESPONSES, {"input": "hello", "stream": True,
                                                        "max_output_tokens": 2}).text)  # fmt: skip
    assert events[-1][0] == "response.failed"
    assert events[-1][1]["response"]["status"] == "failed" and "boom" in events[-1][1]["response"]["error"]["message"]


# ---- the store --------------------------------------------------------------------------------------
def test_retrieve_delete_and_store_false(server):
    body = server.create({"input": "hello", "metadata": {"topic": "greeting"}})
    assert server.call("GET", f"{RESPONSES}/{body['id']}").json() == body
    assert body["metadata"] == {"topic": "greeting"} and body["store"] is True
    deleted = server.call("DELETE", f"{RESPONSES}/{body['id']}")
    assert deleted.json() == {"id": body["id"], "object": "response", "deleted": True}
    for method in ("GET", "DELETE"):
        gone = server.call(method, f"{RESPONSES}/{body['id']}")
        assert gone.status_code == 404 and error_of(gone)["code"] == "response_not_found"
    stored_by_default = server.create({"input": "hello", "store": None})  # null: OpenAI's default, stored
    assert server.call("GET", f"{RESPONSES}/{stored_by_default['id']}").status_code == 200
    unstored = server.create({"input": "hello", "store": False})
    assert server.call("GET", f"{RESPONSES}/{unstored['id']}").status_code == 404
    refused = server.call("POST", RESPONSES, {"input": "more", "previous_response_id": unstored["id"]})
    assert refused.status_code == 404 and error_of(refused)["param"] == "previous_response_id"


def test_previous_response_id_replays_the_earlier_turns(server):
    first = server.create({"instructions": "first rules", "input": "hello"})
    second = server.create({"input": "foo", "previous_response_id": first["id"]})
    server.create({"instructions": "third rules", "input": "bar", "previous_response_id": second["id"]})
    messages, _ = server.engine.templates[-1]
    assert messages == [
        {"role": "system", "content": "third rules"},  # only this request's instructions, as OpenAI's
        {"role": "user", "content": "hello"}, {"role": "assistant", "content": "hello world"},
        {"role": "user", "content": "foo"}, {"role": "assistant", "content": "hello world"},
        {"role": "user", "content": "bar"},
    ]  # fmt: skip
    assert second["previous_response_id"] == first["id"]
    server.call("DELETE", f"{RESPONSES}/{first['id']}")  # an earlier turn's deletion breaks no later one
    server.create({"input": "baz", "previous_response_id": second["id"]})


def test_a_method_the_path_does_not_take_is_a_405_allowing_get_and_delete(server):
    response = server.call("OPTIONS", f"{RESPONSES}/resp_x")
    assert response.status_code == 405 and response.headers["allow"] == "DELETE, GET"


def test_input_items_are_paginated_as_openais(server):
    items = [{"role": "user", "content": f"w{i}"} for i in range(5)]
    body = server.create({"input": items})
    path = f"{RESPONSES}/{body['id']}/input_items"
    everything = server.call("GET", path, order="asc").json()
    ids = [item["id"] for item in everything["data"]]
    assert [item["content"][0]["text"] for item in everything["data"]] == [f"w{i}" for i in range(5)]
    assert everything["object"] == "list" and everything["has_more"] is False
    first = server.call("GET", path, order="asc", limit=2).json()
    assert [i["id"] for i in first["data"]] == ids[:2] and first["has_more"] is True
    assert (first["first_id"], first["last_id"]) == (ids[0], ids[1])
    after = server.call("GET", path, order="asc", limit=2, after=first["last_id"]).json()
    assert [i["id"] for i in after["data"]] == ids[2:4]
    newest = server.call("GET", path, limit=1).json()  # OpenAI's default order: newest first
    assert [i["id"] for i in newest["data"]] == ids[-1:]
    before = server.call("GET", path, order="asc", before=ids[3]).json()
    assert [i["id"] for i in before["data"]] == ids[:3]
    assert server.call("GET", path, limit=0).status_code == 400
    assert server.call("GET", f"{RESPONSES}/resp_nope/input_items").status_code == 404


def test_a_stored_response_survives_a_restart(tmp_path):
    body = Server(tmp_path).create({"input": "hello"})
    restarted = Server(tmp_path)  # a new app on the same file
    assert restarted.call("GET", f"{RESPONSES}/{body['id']}").json() == body
    restarted.create({"input": "foo", "previous_response_id": body["id"]})
    assert restarted.engine.templates[-1][0][1] == {"role": "assistant", "content": "hello world"}


def test_with_api_keys_a_response_is_only_its_creators(tmp_path):
    server = Server(tmp_path, api_key="alice,bob")
    body = server.create({"input": "hello"}, key="alice")
    path = f"{RESPONSES}/{body['id']}"
    for method, where in (("GET", path), ("GET", f"{path}/input_items"), ("DELETE", path)):
        assert server.call(method, where, key="bob").status_code == 404
    continued = server.call("POST", RESPONSES, {"input": "x", "previous_response_id": body["id"]}, key="bob")
    assert continued.status_code == 404 and error_of(continued)["param"] == "previous_response_id"
    assert server.call("GET", path, key="alice").status_code == 200
    assert server.call("DELETE", path, key="alice").status_code == 200


def test_a_conversation_over_the_size_cap_is_a_400(tmp_path):
    server = Server(tmp_path, responses_max_bytes=400)
    response = server.call("POST", RESPONSES, {"input": "hello " * 40, "max_output_tokens": 2})
    assert response.status_code == 400 and error_of(response)["param"] == "input"
    assert server.create({"input": "hello " * 40, "store": False})["store"] is False


def test_page_before_takes_the_items_nearest_it():
    items = [{"id": str(i)} for i in range(6)]
    assert [i["id"] for i in page(items, after=None, before="4", limit=2, order="asc")["data"]] == ["2", "3"]
    assert page(items, after="5", before=None, limit=2, order="asc") == {
        "object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}  # fmt: skip


def test_the_store_url_must_be_sqlite_or_postgresql(tmp_path):
    assert Settings(cache_dir=str(tmp_path)).responses_store_path() == tmp_path / "responses.db"
    assert Settings(responses_store="sqlite:////srv/r.db").responses_store_path() == Path("/srv/r.db")
    Settings(responses_store="postgresql://db/decoda").check()  # tests/test_responses_store_postgres.py
    with pytest.raises(ValueError, match="responses_store"):
        Settings(responses_store="mysql://db/decoda").check()
