"""The ``openai-agents`` SDK end to end: its default model (the Responses API) pointed at a real
Decoda server with the embedded SmolLM2, an ``Agent`` with one ``@function_tool``, ``Runner.run``
and ``Runner.run_streamed`` completing a run that calls the tool and answers.

SmolLM2-135M does not reliably choose to call a tool, so the first turn forces one
(``tool_choice="required"``; the SDK resets it to auto after the call, ``reset_tool_choice``) and
allows one call (``parallel_tool_calls=False``: with several allowed the tiny model keeps calling
until ``max_output_tokens``, an ``incomplete`` response the SDK raises on). Tracing is disabled: the
run reaches nothing but the local server. Every body the SDK sends is recorded, so a test also
shows what the SDK asked of Decoda.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import agents
import httpx
import jsonschema
import pytest
from openai import AsyncOpenAI

from tests.shared_servers import PLAIN
from tests.test_e2e_openai import MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QUESTION = "What is the weather in Oslo?"


@pytest.fixture(scope="module")
def base_url(shared_server):
    agents.set_tracing_disabled(True)  # no trace upload: the run reaches only this server
    return f"{shared_server(*PLAIN)}/v1"  # its Responses store is a file in the session's temporary folder


class WeatherRun:
    """One agent run's world: the client the SDK uses, the bodies it sent, the tool's calls."""

    def __init__(self, base_url: str) -> None:
        self.sent: list[dict[str, Any]] = []
        self.calls: list[dict[str, Any]] = []

        async def record(request: httpx.Request) -> None:
            if request.url.path.endswith("/responses"):
                self.sent.append(json.loads(request.content))

        http = httpx.AsyncClient(event_hooks={"request": [record]}, timeout=300)
        self.client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, http_client=http)
        agents.set_default_openai_client(self.client, use_for_tracing=False)

        @agents.function_tool
        def get_weather(city: str) -> str:
            """Current weather in a city."""
            self.calls.append({"city": city})
            return json.dumps({"city": city, "temperature_c": 3, "sky": "cloudy"})

        self.tool = get_weather
        settings = agents.ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=60,
                                        temperature=0)  # fmt: skip
        self.agent = agents.Agent(name="weather", instructions="Answer weather questions with the get_weather tool.",
                                  model=MODEL, tools=[get_weather], model_settings=settings)  # fmt: skip

    def assert_called_the_tool_and_answered(self, result: Any) -> None:  # noqa: ANN401
        assert self.calls, "the tool was never called"
        for arguments in self.calls:
            jsonschema.validate(arguments, self.tool.params_json_schema)
        kinds = [item.type for item in result.new_items]
        assert kinds.index("tool_call_item") < kinds.index("tool_call_output_item") < kinds.index("message_output_item")
        assert isinstance(result.final_output, str) and result.final_output.strip()
        first, then = self.sent[0], self.sent[1]
        assert first["tool_choice"] == "required" and "tool_choice" not in then  # the SDK's reset_tool_choice
        assert first["tools"][0]["name"] == "get_weather"
        call_outputs = [item for item in then["input"] if item.get("type") == "function_call_output"]
        assert [json.loads(item["output"])["city"] for item in call_outputs] == [call["city"] for call in self.calls]


def test_runner_run_calls_the_tool_and_answers(base_url):
    async def run() -> tuple[WeatherRun, Any]:
        world = WeatherRun(base_url)
        async with world.client:
            return world, await agents.Runner.run(world.agent, QUESTION, max_turns=4)

    world, result = asyncio.run(run())
    world.assert_called_the_tool_and_answered(result)
    assert len(result.raw_responses) == 2  # the call, then the answer


def test_runner_run_streamed_calls_the_tool_and_answers(base_url):
    async def run() -> tuple[WeatherRun, Any, list[str]]:
        world = WeatherRun(base_url)
        async with world.client:
            result = agents.Runner.run_streamed(world.agent, QUESTION, max_turns=4)
            seen = []
            async for event in result.stream_events():
                if event.type == "raw_response_event":
                    seen.append(event.data.type)
                elif event.type == "run_item_stream_event":
                    seen.append(event.name)
            return world, result, seen

    world, result, seen = asyncio.run(run())
    world.assert_called_the_tool_and_answered(result)
    assert all(body.get("stream") is True for body in world.sent)
    wanted = ["response.function_call_arguments.done", "response.completed", "tool_called", "tool_output",
              "response.output_text.delta", "response.completed", "message_output_created"]  # fmt: skip
    positions = [seen.index(name, start) for name, start in _in_order(seen, wanted)]
    assert positions == sorted(positions)


def _in_order(seen: list[str], wanted: list[str]) -> list[tuple[str, int]]:
    """Each wanted event with the position after the one before it (``list.index`` raises if absent)."""
    pairs, start = [], 0
    for name in wanted:
        pairs.append((name, start))
        start = seen.index(name, start) + 1
    return pairs


def test_auto_previous_response_id_continues_the_stored_response(base_url):
    """The SDK's stateful mode: the second turn sends only the tool's output and the first response's
    id; Decoda replays the stored conversation, and the replica's prefix cache serves its start."""

    async def run() -> tuple[WeatherRun, Any]:
        world = WeatherRun(base_url)
        async with world.client:
            return world, await agents.Runner.run(world.agent, QUESTION, max_turns=4, auto_previous_response_id=True)

    world, result = asyncio.run(run())
    world.assert_called_the_tool_and_answered(result)
    first, then = world.sent
    assert then["previous_response_id"] == result.raw_responses[0].response_id
    assert [item["type"] for item in then["input"]] == ["function_call_output"]
    usage = result.raw_responses[1].usage
    assert usage.input_tokens > result.raw_responses[0].usage.input_tokens
    assert usage.input_tokens_details.cached_tokens > 0
