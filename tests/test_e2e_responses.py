"""The Responses API end to end: the real ``openai`` client, a real server with the embedded SmolLM2
and its SQLite store in a temporary folder: create, stream, parse, retrieve, delete, input items, a
function-call round trip, a three-turn conversation, beam search as on chat, background responses
(polled, cancelled, a dropped stream resumed with ``starting_after``), and a restart (the last test:
a second server on the same store file continues the conversation)."""

from __future__ import annotations

import json
import time

import jsonschema
import openai
import pydantic
import pytest

from tests.test_e2e_openai import MODEL, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"],
        "additionalProperties": False}  # fmt: skip
TOOLS = [{"type": "function", "name": "get_weather", "description": "Current weather in a city",
          "parameters": CITY, "strict": True}]  # fmt: skip


class Served:
    """The module's one server at a time; ``restart`` stops it and starts another on the same store."""

    def __init__(self, store: str) -> None:
        self.flags = ("--max-model-len", "2048", "--responses-store", store)
        self.proc = None
        self.start()

    def start(self) -> None:
        base, self.proc = start_server(*self.flags)
        self.client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)

    def restart(self) -> None:
        assert stop_server(self.proc) == 0
        self.start()


@pytest.fixture(scope="module")
def served(smollm2, tmp_path_factory):
    served = Served(f"sqlite:///{tmp_path_factory.mktemp('responses') / 'responses.db'}")
    yield served
    stop_server(served.proc)


@pytest.fixture
def client(served):
    return served.client


def test_create_retrieve_input_items_delete(client):
    created = client.responses.create(model=MODEL, input="What is the capital of France?", max_output_tokens=30,
                                      temperature=0, metadata={"case": "e2e"})  # fmt: skip
    assert created.status == "completed" and "Paris" in created.output_text
    assert created.usage.input_tokens > 0 and created.usage.total_tokens == created.usage.input_tokens + \
        created.usage.output_tokens  # fmt: skip
    retrieved = client.responses.retrieve(created.id)
    assert retrieved.output_text == created.output_text and retrieved.metadata == {"case": "e2e"}
    (item,) = client.responses.input_items.list(created.id).data
    assert item.role == "user" and item.content[0].text == "What is the capital of France?"
    client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(created.id)


def test_stream_reads_as_the_non_streamed_response(client):
    body = {"model": MODEL, "input": "Say hello in one sentence.", "max_output_tokens": 60, "temperature": 0}
    with client.responses.stream(**body) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]  # fmt: skip
    assert kinds[-1] == "response.completed" and "response.output_text.delta" in kinds
    assert final.output_text == client.responses.create(**body).output_text
    assert client.responses.retrieve(final.id).output_text == final.output_text
    created = client.responses.create(**body, stream=True)
    assert [event.sequence_number for event in created] == list(range(len(kinds)))


def test_parse_returns_the_pydantic_model(client):
    class City(pydantic.BaseModel):
        name: str
        country: str

    parsed = client.responses.parse(model=MODEL, input="Name a city in France, as JSON.", text_format=City,
                                    max_output_tokens=60, temperature=0)  # fmt: skip
    assert isinstance(parsed.output_parsed, City) and parsed.output_parsed.name


def test_a_function_call_round_trip(client):
    first = client.responses.create(model=MODEL, input="What is the weather in Oslo?", tools=TOOLS,
                                    tool_choice="required", parallel_tool_calls=False, max_output_tokens=80,
                                    temperature=0)  # fmt: skip
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, CITY)
    result = {"type": "function_call_output", "call_id": call.call_id,
              "output": json.dumps({"city": arguments["city"], "temperature_c": 3, "sky": "cloudy"})}  # fmt: skip
    second = client.responses.create(model=MODEL, previous_response_id=first.id, input=[result], tools=TOOLS,
                                     max_output_tokens=60, temperature=0)  # fmt: skip
    assert second.status in ("completed", "incomplete") and second.output_text
    assert second.usage.input_tokens > first.usage.input_tokens  # the call and its result are in the prompt
    (listed,) = client.responses.input_items.list(second.id).data
    assert listed.type == "function_call_output" and listed.call_id == call.call_id


def test_a_three_turn_conversation(client, served):
    turns, previous = [], None
    for question in ("My name is Ada.", "I live in Oslo.", "What is my name?"):
        response = client.responses.create(model=MODEL, input=question, previous_response_id=previous,
                                           max_output_tokens=16, temperature=0)  # fmt: skip
        turns.append(response)
        previous = response.id
    for earlier, later in zip(turns, turns[1:], strict=False):  # each prompt holds the turns before it
        assert later.usage.input_tokens > earlier.usage.input_tokens + earlier.usage.output_tokens
    assert turns[2].usage.input_tokens_details.cached_tokens > 0  # the earlier turns' blocks were reused
    served.last_conversation = turns


def test_beam_search_is_token_identical_to_chat(client):
    question = "Name three colours."
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                          max_tokens=24, temperature=0,
                                          extra_body={"num_beams": 2, "return_token_ids": True})  # fmt: skip
    response = client.responses.create(model=MODEL, input=question, max_output_tokens=24, temperature=0,
                                       extra_body={"num_beams": 2})  # fmt: skip
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.output_tokens == len(chat.choices[0].token_ids)


def poll(client: openai.OpenAI, response_id: str, timeout: float = 120.0):  # noqa: ANN201
    """Retrieve until the background response is no longer queued or in progress."""
    deadline = time.monotonic() + timeout
    while (response := client.responses.retrieve(response_id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, f"still {response.status}"
        time.sleep(0.2)
    return response


def test_a_background_response_is_queued_then_polled_to_the_same_answer(client):
    body = {"model": MODEL, "input": "What is the capital of France?", "max_output_tokens": 30, "temperature": 0}
    created = client.responses.create(**body, background=True)
    assert created.status == "queued" and created.background is True and created.output == []
    final = poll(client, created.id)
    assert final.status == "completed" and final.output_text == client.responses.create(**body).output_text
    assert "Paris" in final.output_text


def test_cancel_stops_a_background_response_with_its_output_so_far(client):
    created = client.responses.create(model=MODEL, input="Tell me a very long story about a dragon.",
                                      max_output_tokens=1500, temperature=0, background=True,
                                      extra_body={"ignore_eos": True})  # fmt: skip
    with client.responses.retrieve(created.id, stream=True) as events:  # follow it to its first text
        assert any(event.type == "response.output_text.delta" for event in events)
    cancelled = client.responses.cancel(created.id)
    assert cancelled.status == "cancelled" and 0 < cancelled.usage.output_tokens < 1500
    assert cancelled.output_text and client.responses.retrieve(created.id).status == "cancelled"
    assert client.responses.cancel(created.id).output_text == cancelled.output_text  # a finished one: unchanged
    foreground = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError, match="Only background responses can be cancelled"):
        client.responses.cancel(foreground.id)


def test_a_background_stream_dropped_early_is_resumed_with_starting_after(client):
    body = {"model": MODEL, "input": "Count from one to twenty in words.", "max_output_tokens": 80,
            "temperature": 0}  # fmt: skip
    first = []
    with client.responses.create(**body, background=True, stream=True) as stream:
        for event in stream:
            first.append(event)
            if len(first) == 6:
                break  # the client goes away: the response keeps running
    assert [event.type for event in first[:3]] == ["response.created", "response.queued", "response.in_progress"]
    response_id = first[0].response.id
    rest = list(client.responses.retrieve(response_id, stream=True, starting_after=first[-1].sequence_number))
    events = first + rest
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == events[-1].response.output_text == poll(client, response_id).output_text
    again = list(client.responses.retrieve(response_id, stream=True))  # from the start, once it has ended
    assert [event.model_dump() for event in again] == [event.model_dump() for event in events]


def test_a_restarted_server_continues_the_conversation(served):
    turns = served.last_conversation
    served.restart()
    assert served.client.responses.retrieve(turns[-1].id).output_text == turns[-1].output_text
    more = served.client.responses.create(model=MODEL, input="Where do I live?", previous_response_id=turns[-1].id,
                                          max_output_tokens=16, temperature=0)  # fmt: skip
    assert more.usage.input_tokens > turns[-1].usage.input_tokens + turns[-1].usage.output_tokens
