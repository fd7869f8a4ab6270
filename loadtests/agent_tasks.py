"""Agent tasks eval: every task of ``loadtests.agent_task_set`` through agent SDKs on both OpenAI APIs.

Each run is one agent (greedy, ``max_tokens`` per turn, at most six model turns) answering a question
whose facts only its function tools hold; it passes when it called the tools with the right
arguments and its final answer states the known facts. Prints one line per task and SDK (pass or
what went wrong), then the totals per SDK. ``--failures FILE`` writes each failed run's exchanges
with the server (the bodies the SDK sent, what Decoda answered) as Markdown, for finding why;
``--failures-json FILE`` the same as JSON, which ``loadtests.agent_reference`` replays through
transformers' ``generate()`` to tell the model's failures from the server's.

    .venv/bin/python -m loadtests.agent_tasks --model qwen2.5-coder-1.5b          # starts a server
    .venv/bin/python -m loadtests.agent_tasks --base-url http://127.0.0.1:8000/v1  # a running one
    .venv/bin/python -m loadtests.agent_tasks --sdks agents-responses,agents-chat,langchain-chat

The default SDKs are the ``openai-agents`` SDK's two models (Responses and Chat Completions); every
pair in ``loadtests.agent_sdks.SDKS`` can be named. Runs go one at a time unless ``--concurrency``
says otherwise (greedy replies do not depend on their batch neighbours' prompts, but the order of
float sums may change with the batch's size).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from loadtests.agent_sdks import SDKS, Outcome, run_task
from loadtests.agent_task_set import TASKS, Task
from loadtests.compare import cpu_summary, local_decoda


async def run_all(base_url: str, model: str, sdks: list[str], tasks: list[Task], max_tokens: int,
                  concurrency: int) -> list[tuple[str, Task, Outcome]]:  # fmt: skip
    """Every (sdk, task) run, at most ``concurrency`` at once, each line printed as its run ends."""
    gate = asyncio.Semaphore(concurrency)

    async def one(sdk: str, task: Task) -> tuple[str, Task, Outcome]:
        async with gate:
            outcome = await run_task(sdk, base_url, model, task, max_tokens)
        problems = outcome.problems(task)
        verdict = "pass" if not problems else "FAIL " + "; ".join(problems)
        calls = ", ".join(f"{name}({json.dumps(args)})" for name, args in outcome.made)
        print(f"{sdk:22} {task.name:20} {outcome.seconds:6.1f}s  {verdict}\n{'':22} calls: {calls or '-'}; "
              f"answer: {(outcome.answer or '-').strip()[:160]!r}", flush=True)  # fmt: skip
        return sdk, task, outcome

    return list(await asyncio.gather(*(one(sdk, task) for sdk in sdks for task in tasks)))


def print_totals(results: list[tuple[str, Task, Outcome]], sdks: list[str]) -> int:
    """The Markdown table of passes per SDK and task kind; returns the number of failed runs."""
    kinds = sorted({task.kind for _, task, _ in results})
    print(f"\n| SDK / API | {' | '.join(kinds)} | total |\n|---|{'---|' * len(kinds)}---|")
    failed = 0
    for sdk in sdks:
        mine = [(task, outcome) for name, task, outcome in results if name == sdk]
        cells = []
        for kind in kinds:
            of_kind = [not outcome.problems(task) for task, outcome in mine if task.kind == kind]
            cells.append(f"{sum(of_kind)}/{len(of_kind)}")
        passed = sum(not outcome.problems(task) for task, outcome in mine)
        failed += len(mine) - passed
        print(f"| {sdk} | {' | '.join(cells)} | {passed}/{len(mine)} |")
    return failed


def write_failures(path: Path, results: list[tuple[str, Task, Outcome]]) -> None:
    """Each failed run: the task, what went wrong, and every exchange (request body, reply) in order."""
    lines = ["# Failed agent runs (loadtests/agent_tasks.py)", ""]
    for sdk, task, outcome in results:
        problems = outcome.problems(task)
        if not problems:
            continue
        lines += [f"## {sdk} / {task.name}", "", f"Question: {task.question}", "", "Problems: " + "; ".join(problems),
                  "", f"Calls made: {outcome.made}", ""]  # fmt: skip
        for number, (sent, answered) in enumerate(outcome.exchanges, 1):
            lines += [f"### exchange {number}: sent", "", "```json", json.dumps(sent, indent=1)[:6000], "```", "",
                      f"### exchange {number}: answered", "", "```json", json.dumps(answered, indent=1)[:6000], "```",
                      ""]  # fmt: skip
    path.write_text("\n".join(lines))


@contextlib.contextmanager
def server(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """The base URL and served model name: ``--base-url``'s server, else one started for this run."""
    if args.base_url:
        base = args.base_url.rstrip("/")
        yield base, args.served_model or httpx.get(f"{base}/models", timeout=30).json()["data"][0]["id"]
        return
    flags = ["--model", args.model, "--max-model-len", "4096", *args.server_flags.split()]
    print(f"server: decoda serve {' '.join(flags)}", flush=True)
    with local_decoda(flags, timeout=args.start_timeout) as (url, _):
        yield f"{url}/v1", httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", help="a running server's OpenAI base URL (…/v1); else one is started")
    parser.add_argument("--served-model", help="the model name to send (default: the server's first)")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="--model of the server started")
    parser.add_argument("--server-flags", default="", help="more flags for the server started")
    parser.add_argument("--start-timeout", type=float, default=600)
    parser.add_argument("--sdks", default="agents-responses,agents-chat", help=f"of {', '.join(SDKS)}")
    parser.add_argument("--tasks", default="", help="task names (default: all of them)")
    parser.add_argument("--max-tokens", type=int, default=200, help="per model turn")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--failures", type=Path, help="write each failed run's exchanges here (Markdown)")
    parser.add_argument("--failures-json", type=Path, help="the same as JSON (loadtests.agent_reference reads it)")
    args = parser.parse_args()
    sdks = args.sdks.split(",")
    unknown = [sdk for sdk in sdks if sdk not in SDKS]
    if unknown:
        parser.error(f"unknown SDK {unknown}: choose from {', '.join(SDKS)}")
    names = set(args.tasks.split(",")) if args.tasks else None
    tasks = [task for task in TASKS if names is None or task.name in names]
    print(cpu_summary(), flush=True)
    started = time.monotonic()
    with server(args) as (base, model):
        results = asyncio.run(run_all(base, model, sdks, tasks, args.max_tokens, args.concurrency))
    failed = print_totals(results, sdks)
    print(f"\n{len(results) - failed}/{len(results)} runs passed in {time.monotonic() - started:.0f} s")
    if args.failures:
        write_failures(args.failures, results)
        print(f"failed runs' exchanges: {args.failures}")
    if args.failures_json:
        failed_runs = [
            {"sdk": sdk, "task": task.name, "problems": outcome.problems(task), "exchanges": outcome.exchanges}
            for sdk, task, outcome in results
            if outcome.problems(task)
        ]
        args.failures_json.write_text(json.dumps(failed_runs, indent=1))
        print(f"failed runs as JSON: {args.failures_json}")


if __name__ == "__main__":
    main()
