"""Tool calls written as fenced or bare JSON (as Qwen2.5-Coder writes them), end to end: a real uvicorn
serving an engine steered to write a given reply a few characters per token, the real ``openai`` client,
chat (whole and streamed, as ``chat.completions.stream`` assembles it) and Responses. The calls arrive as
``tool_calls`` with ``finish_reason: "tool_calls"``, prose around them as content, and JSON that is no
call as content; under ``--tool-call-parser auto`` with Qwen2.5's own chat template the same."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import openai
import pytest

from decoding import FinishReason, GenerationParams, RequestOutput, SequenceDelta
from decoding.params.model_checks import ModelFacts
from server.app import create_app
from server.config.settings import Settings
from tests.fake_engine import WORDS, FakeEngineClient
from tests.test_api import MODEL
from tests.threaded_server import uvicorn_in_thread

pytestmark = pytest.mark.e2e

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                            "parameters": CITY}}  # fmt: skip
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
PARIS = ("get_weather", {"city": "Paris"})
LONDON = ("get_weather", {"city": "London"})
QWEN_TEMPLATE = json.loads((Path(__file__).parent / "golden" / "qwen_tool_replies.json").read_text())["gguf"][
    "chat_template"
]  # the GGUF's own, as recorded with its replies

# (form, the model's reply, content, calls)
REPLIES = [
    ("fenced", '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```', None,
     [PARIS]),
    ("bare", '{"name": "get_weather", "arguments": {"city": "Paris"}}', None, [PARIS]),
    ("bare_array", '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arguments": '
     '{"city": "London"}}]', None, [PARIS, LONDON]),
    ("prose_then_fenced", 'I will check both cities.\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
     '\n```\n```json\n{"name": "get_weather", "arguments": {"city": "London"}}\n```', "I will check both cities.",
     [PARIS, LONDON]),
    ("tags", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', None, [PARIS]),
]  # fmt: skip
NOT_A_CALL = 'A person as JSON:\n```json\n{"name": "Alice", "age": 30}\n```'


class SteeredEngine(FakeEngineClient):
    """Writes ``reply`` a few characters per token, whatever it is asked; keeps the params it got."""

    facts = ModelFacts(vocab_size=len(WORDS), max_model_len=4096, num_layers=4)  # type: ignore[assignment]
    reply = ""

    def __init__(self, template: str | None = None) -> None:
        super().__init__()
        self.template = template

    def chat_template_source(self) -> str | None:
        return self.template

    async def compile_structured_output(self, params: GenerationParams) -> GenerationParams:
        return params  # the call grammar is the real one; this engine only writes the steered reply

    def generate(self, request_id: str, prompt_ids: list[int], params: GenerationParams) -> AsyncIterator:
        self.submitted.append((request_id, prompt_ids, params))
        return self._steered(request_id, prompt_ids, self.reply)

    async def _steered(self, request_id: str, prompt_ids: list[int], reply: str) -> AsyncIterator[RequestOutput]:
        pieces = [reply[i : i + 3] for i in range(0, len(reply), 3)]
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            delta = SequenceDelta(0, piece, [i + 1], None, FinishReason.STOP if last else None)
            yield RequestOutput(request_id, [delta], len(prompt_ids), i + 1, finished=last)


@pytest.fixture(scope="module", params=["hermes", "auto"])
def served(request) -> Iterator[tuple[openai.OpenAI, SteeredEngine]]:
    """The default parser (hermes), and ``auto`` choosing for Qwen2.5's template."""
    engine = SteeredEngine(QWEN_TEMPLATE)
    settings = Settings(tool_call_parser=request.param)
    with uvicorn_in_thread(create_app(settings, engine)) as base:
        assert settings.tool_call_parser == "hermes"  # what auto chose for this template
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0), engine


def calls_of(tool_calls) -> list[tuple[str, dict]]:
    return [(call.function.name, json.loads(call.function.arguments)) for call in tool_calls or []]


@pytest.mark.parametrize(("form", "reply", "content", "expected"), REPLIES, ids=[r[0] for r in REPLIES])
def test_chat_returns_the_calls_whole_and_streamed(served, form, reply, content, expected):
    client, engine = served
    engine.reply = reply
    whole = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=200)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and calls_of(choice.message.tool_calls) == expected
    assert choice.message.content == content
    grammar = engine.submitted[-1][2].structured_output.value
    assert "bare_head[lazy]" in grammar and "fenced_head[lazy]" in grammar  # JSON calls held to their schema too
    with client.chat.completions.stream(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=200) as stream:
        chunks = list(stream)
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls" and calls_of(final.message.tool_calls) == expected
    assert ((final.message.content or "").strip() or None) == content  # streamed text is sent as it comes
    streamed = "".join(c.chunk.choices[0].delta.content or "" for c in chunks if c.type == "chunk" and c.chunk.choices)
    assert '"name"' not in streamed and "```" not in streamed  # no call text in a content delta


def test_json_that_is_no_call_stays_content(served):
    client, engine = served
    engine.reply = NOT_A_CALL
    choice = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=200).choices[0]
    assert (choice.finish_reason, choice.message.content, choice.message.tool_calls) == ("stop", NOT_A_CALL, None)
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=200,
                                                 stream=True))  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == NOT_A_CALL


def test_responses_returns_a_fenced_call_as_a_function_call_item(served):
    client, engine = served
    engine.reply = REPLIES[0][1]
    tool = {"type": "function", **WEATHER["function"]}
    response = client.responses.create(model=MODEL, input="What is the weather in Paris?", tools=[tool],
                                       max_output_tokens=200)  # fmt: skip
    items = [(item.type, getattr(item, "name", None), getattr(item, "arguments", None)) for item in response.output]
    assert items == [("function_call", "get_weather", '{"city": "Paris"}')]
    with client.responses.stream(model=MODEL, input="What is the weather in Paris?", tools=[tool],
                                 max_output_tokens=200) as stream:  # fmt: skip
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert [(item.type, item.name, item.arguments) for item in final.output] == [
        ("function_call", "get_weather", '{"city": "Paris"}')]  # fmt: skip
