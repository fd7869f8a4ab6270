"""One agent task run through one agent SDK on one OpenAI API, each SDK used as its documentation says.

``SDKS`` names each pair: the ``openai-agents`` SDK's Responses and Chat Completions models,
``pydantic-ai``'s ``OpenAIResponsesModel`` and ``OpenAIChatModel``, and LangChain's ``create_agent``
over ``langchain-openai``'s ``ChatOpenAI`` (``use_responses_api`` on or off). Every run is greedy
(temperature 0) with a bounded ``max_tokens`` per model turn and a bounded number of turns, and its
own ``httpx`` client records each exchange with the server, so a failed run shows what the SDK sent
and what Decoda answered (``Outcome.exchanges``). The SDKs are imported when a run needs them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from loadtests.agent_task_set import INSTRUCTIONS, Task, ToolLog

MAX_TURNS = 6  # model turns per run: the longest task needs three calls in sequence and an answer


@dataclass
class Outcome:
    """What one run produced: the final answer (None when it failed), the calls, what went wrong."""

    answer: str | None
    made: list[tuple[str, dict[str, Any]]]
    error: str | None = None
    seconds: float = 0.0
    exchanges: list[tuple[dict[str, Any], Any]] = field(default_factory=list)

    def problems(self, task: Task) -> list[str]:
        return ([self.error] if self.error else []) + task.check(self.answer, self.made)


class Recorder:
    """An ``httpx.AsyncClient`` whose hooks keep each POST body and the JSON (or text) answered."""

    def __init__(self) -> None:
        self.exchanges: list[tuple[dict[str, Any], Any]] = []
        self.client = httpx.AsyncClient(timeout=600, event_hooks={"response": [self._keep]})

    async def _keep(self, response: httpx.Response) -> None:
        if response.request.method != "POST":
            return
        await response.aread()
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        self.exchanges.append((json.loads(response.request.content or b"{}"), body))


async def _agents(api: str, base_url: str, model: str, task: Task, log: ToolLog, http: httpx.AsyncClient,
                  max_tokens: int) -> str:  # fmt: skip
    import agents
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)  # no trace upload: the run reaches only this server
    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, http_client=http)
    kind = agents.OpenAIResponsesModel if api == "responses" else agents.OpenAIChatCompletionsModel
    agent = agents.Agent(name=task.name, instructions=INSTRUCTIONS, model=kind(model=model, openai_client=client),
                         tools=[agents.function_tool(log.wrap(tool)) for tool in task.tools],
                         model_settings=agents.ModelSettings(temperature=0, max_tokens=max_tokens))  # fmt: skip
    result = await agents.Runner.run(agent, task.question, max_turns=MAX_TURNS)
    return str(result.final_output)


async def _pydantic_ai(api: str, base_url: str, model: str, task: Task, log: ToolLog, http: httpx.AsyncClient,
                       max_tokens: int) -> str:  # fmt: skip
    from openai import AsyncOpenAI
    from pydantic_ai import Agent, Tool, UsageLimits
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, http_client=http)
    kind = OpenAIResponsesModel if api == "responses" else OpenAIChatModel
    agent = Agent(kind(model, provider=OpenAIProvider(openai_client=client)), instructions=INSTRUCTIONS,
                  tools=[Tool(log.wrap(tool), takes_ctx=False) for tool in task.tools],
                  model_settings={"temperature": 0, "max_tokens": max_tokens})  # fmt: skip
    result = await agent.run(task.question, usage_limits=UsageLimits(request_limit=MAX_TURNS))
    return str(result.output)


async def _langchain(api: str, base_url: str, model: str, task: Task, log: ToolLog, http: httpx.AsyncClient,
                     max_tokens: int) -> str:  # fmt: skip
    from langchain.agents import create_agent
    from langchain_core.tools import StructuredTool
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=model, base_url=base_url, api_key="unused", temperature=0, max_tokens=max_tokens,
                     max_retries=0, use_responses_api=api == "responses", http_async_client=http)  # fmt: skip
    tools = [StructuredTool.from_function(func=log.wrap(tool), parse_docstring=True) for tool in task.tools]
    agent = create_agent(llm, tools, system_prompt=INSTRUCTIONS)
    state = await agent.ainvoke({"messages": [{"role": "user", "content": task.question}]},
                                {"recursion_limit": 2 * MAX_TURNS + 1})  # fmt: skip
    return state["messages"][-1].text


Runner = Callable[[str, str, str, Task, ToolLog, httpx.AsyncClient, int], Awaitable[str]]
SDKS: dict[str, tuple[Runner, str]] = {
    "agents-responses": (_agents, "responses"),
    "agents-chat": (_agents, "chat"),
    "pydantic-ai-responses": (_pydantic_ai, "responses"),
    "pydantic-ai-chat": (_pydantic_ai, "chat"),
    "langchain-responses": (_langchain, "responses"),
    "langchain-chat": (_langchain, "chat"),
}


async def run_task(sdk: str, base_url: str, model: str, task: Task, max_tokens: int = 200) -> Outcome:
    """Run ``task`` through ``sdk`` (a key of ``SDKS``) against ``base_url`` (ending in ``/v1``).

    An exception the SDK raises (too many turns, a refused request) is the outcome's ``error``, not a
    crash: an eval counts it as a failed task and goes on."""
    runner, api = SDKS[sdk]
    log, recorder = ToolLog(), Recorder()
    start = time.monotonic()
    try:
        async with recorder.client:
            answer: str | None = await runner(api, base_url, model, task, log, recorder.client, max_tokens)
        error = None
    except Exception as exc:  # noqa: BLE001 - every SDK raises its own kinds; the eval reports them
        answer, error = None, f"{type(exc).__name__}: {exc}"
    return Outcome(answer, log.made, error, time.monotonic() - start, recorder.exchanges)
