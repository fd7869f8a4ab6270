"""Qwen2.5-Coder-1.5B-Instruct's own replies to prompts with tools (``tests/golden/qwen_tool_replies.json``,
recorded by ``tests/make_qwen_tool_replies.py``: greedy, each prompt rendered by the GGUF's own chat template
and by the one Decoda serves (mended: ``decoding.text.template_mends``), each once with nothing
constraining the reply and once under the grammar chat puts on a reply under ``tool_choice: "auto"``) read
by the parser ``--tool-call-parser auto`` picks for these templates: each reply whole and streamed in small
pieces gives what a person reads in it (``EXPECTED``), calls with arguments valid for their tool, prose and
the model's own JSON and code as content. On the previous main the parser read none of this model's calls:
it writes them as fenced JSON (its own template) or bare JSON (the mended one), never in the
``<tool_call>`` tags both templates ask for.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from decoding.text.template_mends import mend_chat_template
from server.output.tool_formats.calls import parse_whole
from server.output.tool_parser import PARSERS, resolve_parser
from tests.test_tool_formats import splits

GOLDEN = json.loads((Path(__file__).parent / "golden" / "qwen_tool_replies.json").read_text())
CASES = {(case["id"], case["template"]): case for case in GOLDEN["cases"]}
TEMPLATES = {"gguf": GOLDEN["gguf"]["chat_template"], "served": mend_chat_template(GOLDEN["gguf"]["chat_template"])[0]}
PARSER = resolve_parser("auto", TEMPLATES["gguf"])[0]
PROSE = "prose"  # the reply is content, calls none

# what each recorded reply is, as a person reads it: its calls (name, arguments), or prose; where the
# replies differ, per template ("gguf", "served"), kind of recording ("free", "auto") or both ("gguf/free")
EXPECTED = {
    "weather": [("get_weather", {"city": "Paris", "unit": "celsius"})],
    "weather_among_tools": [("get_weather", {"city": "Tokyo", "unit": "celsius"})],
    "weather_fahrenheit": [("get_weather", {"city": "Boston", "unit": "fahrenheit"})],
    "multiply": [("multiply", {"a": 1234, "b": 5678})],
    "add": [("add", {"a": 17.5, "b": 24.25})],
    "lookup": [("lookup_country", {"country": "Australia"})],
    "search": [("search_docs", {"query": "install server"})],
    "two_cities": [("get_weather", {"city": "Paris", "unit": "celsius"})],  # the model asks for one city only
    "weather_and_time": {"gguf": [("get_weather", {"city": "Rome", "unit": "celsius"})],
                         "served": [("get_weather", {"city": "Rome", "unit": "celsius"}),  # two bare objects
                                    ("get_time", {"city": "Rome"})]},
    "two_sums": [("add", {"a": 3, "b": 4})],
    "two_calls_asked": {"free": [("get_weather", {"city": "Paris", "unit": "celsius"})],  # one, then the end
                        "served": [("get_weather", {"city": "Paris", "unit": "celsius"})],
                        "gguf/auto": [("get_weather", {"city": "Paris", "unit": "celsius"}),  # two fenced blocks
                                      ("get_weather", {"city": "London", "unit": "celsius"})]},
    "two_calls_system": [("get_weather", {"city": "Paris", "unit": "celsius"}),  # two objects in one fence
                         ("get_weather", {"city": "London", "unit": "celsius"})],
    "weather_and_time_both": [("get_weather", {"city": "Berlin", "unit": "celsius"}), ("get_time", {"city": "Berlin"})],
    "three_sums": [("add", {"a": 1, "b": 2})],
    "haiku": PROSE,
    "greeting": [("get_weather", {"city": "New York", "unit": "celsius"})],  # a call nobody asked for, but a call
    "json_example": PROSE,  # {"name": "John Doe", "age": 30} in a json fence: the model's JSON, no call
    "code": PROSE,  # a python block returning {"name": "get_weather", "arguments": {...}}: code, no call
    "explain_tool": PROSE,
    "after_result": {"gguf/free": PROSE,  # the call again with an invented "response" key beside it: no call
                     "gguf/auto": [("get_weather", {"city": "Paris"})],  # the grammar ends the object at its call
                     "served": [("get_weather", {"city": "Paris", "unit": "celsius"})]},  # the call again
    "after_lookup": [("lookup_country", {"country": "Australia"})],
}  # fmt: skip


def expected(case_id: str, template: str, kind: str):  # noqa: ANN201
    reading = EXPECTED[case_id]
    if not isinstance(reading, dict):
        return reading
    return next(reading[key] for key in (f"{template}/{kind}", template, kind) if key in reading)


RECORDED = [(case_id, template, kind) for case_id, template in CASES for kind in ("free", "auto")]


def test_the_recording_is_of_this_model_and_auto_picks_hermes_for_both_templates():
    assert GOLDEN["gguf"]["bytes"] == 1_117_320_768 and GOLDEN["gguf"]["file"].startswith("qwen2.5-coder-1.5b")
    for template in TEMPLATES.values():
        assert "<tool_call>" in template and resolve_parser("auto", template)[0] == PARSER == "hermes"
    assert {case_id for case_id, _ in CASES} == set(EXPECTED)


def read(case_id: str, template: str, kind: str, pieces: list[str] | None = None) -> tuple[str | None, list]:
    """The reply's (content, calls), whole or fed in ``pieces`` (content then trimmed as a body trims it)."""
    case = CASES[(case_id, template)]
    names = [tool["function"]["name"] for tool in case["tools"]]
    truncated = case[kind]["finish_reason"] == "length"
    if pieces is None:
        content, calls = parse_whole(case[kind]["text"], lambda: PARSERS[PARSER](names), truncated)
    else:
        stream, content, calls = PARSERS[PARSER](names), "", []
        for piece in pieces:
            more, found = stream.feed(piece)
            content, calls = content + more, calls + found
        more, found = stream.finish(truncated)
        content, calls = content + more, calls + found
        content = (content.strip() or None) if calls else content
    return content, [(call.name, json.loads(call.arguments)) for call in calls]


@pytest.mark.parametrize(("case_id", "template", "kind"), RECORDED)
def test_each_recorded_reply_reads_as_the_model_meant_it(case_id, template, kind):
    text = CASES[(case_id, template)][kind]["text"]
    content, calls = read(case_id, template, kind)
    reading = expected(case_id, template, kind)
    if reading == PROSE:
        assert (content, calls) == (text, [])
        return
    assert calls == reading and content is None
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in CASES[(case_id, template)]["tools"]}
    for name, arguments in calls:
        jsonschema.validate(arguments, schemas[name])


@pytest.mark.parametrize(("case_id", "template", "kind"), RECORDED)
def test_each_recorded_reply_streamed_in_small_pieces_reads_the_same(case_id, template, kind):
    text = CASES[(case_id, template)][kind]["text"]
    whole = read(case_id, template, kind)
    for pieces in [[text[i : i + size] for i in range(0, len(text), size)] for size in (1, 2, 3, 5)] + splits(text, 7):
        assert read(case_id, template, kind, pieces) == whole, pieces
