"""Finished tool calls survive a reply cut in a later one, in every format and every API (chat whole
and streamed, Messages whole and streamed, Responses whole and streamed); a forced call's grammar lets
the reply end after any complete call; a number no float holds (``1e999``) reaches every client as
valid JSON, as the model wrote it (``server.output.exact_json``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from decoding import FinishReason, RequestOutput, SequenceDelta
from server.output.exact_json import ExactJSONResponse, RawNumber, dumps, loads
from server.output.tool_parser import PARSERS, parse_whole
from server.translate.tools import NamedToolChoice, call_grammar
from tests.test_responses_api import RecordingEngine, Server
from tests.test_tool_formats import NAMES, NOW, TIME, WEATHER, calls_of, splits, streamed, written


def strict_loads(text: str) -> object:
    """What a strict client (JavaScript's ``JSON.parse``) accepts: no ``NaN``/``Infinity``."""

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


# ---- the parsers -------------------------------------------------------------------------------------
OSLO = ("get_weather", {"city": "Oslo"})
# (format, a reply whose second call's JSON is whole and whose end marker the cut left unwritten)
CUT_AFTER_ARGUMENTS = [
    ("hermes", written("hermes", [NOW, OSLO])[: -len("_call>")]),
    ("hermes", written("hermes", [NOW, OSLO])[: -len("</tool_call>")]),
    ("llama3_json", written("llama3_json", [NOW, OSLO])),
    ("pythonic", written("pythonic", [NOW, OSLO])[:-1]),
    ("mistral", written("mistral", [NOW, OSLO])[:-1]),
    ("openai", written("openai", [NOW, OSLO])[: -len("call|>")]),
    ("openai", written("openai", [NOW, OSLO])[: -len("<|call|>")]),
]


@pytest.mark.parametrize(("name", "text"), CUT_AFTER_ARGUMENTS)
def test_a_call_whose_arguments_are_whole_is_finished_even_cut_inside_its_end_marker(name, text):
    whole = parse_whole(text, lambda: PARSERS[name](NAMES), truncated=True)
    assert calls_of(whole[1]) == [NOW, OSLO] and whole[0] is None
    for pieces in splits(text, seed=len(text)):
        content, calls = streamed(name, text, pieces, truncated=True)
        assert calls_of(calls) == [NOW, OSLO] and not content.strip(), pieces


@pytest.mark.parametrize("name", list(PARSERS))
def test_a_call_cut_inside_its_arguments_is_dropped_and_the_one_before_kept(name):
    text = written(name, [NOW, ("get_weather", {"city": "Oslo", "days": 3})])
    cut = text[: text.index("3") + 1]  # the arguments' object still open: the number may go on
    content, calls = parse_whole(cut, lambda: PARSERS[name](NAMES), truncated=True)
    assert calls_of(calls) == [NOW] and content is None


# (format, a call of get_weather whose arguments hold 1e999 and -1E+400, as the format writes them)
HUGE = {"hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1e999, "x": [-1E+400]}}'
                  "\n</tool_call>",
        "llama3_json": '{"name": "get_weather", "parameters": {"city": "Oslo", "days": 1e999, "x": [-1E+400]}}',
        "pythonic": '[get_weather(city="Oslo", days=1e999, x=[-1E+400])]',
        "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo", "days": 1e999, '
                   '"x": [-1E+400]}}]',
        "openai": '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo", '
                  '"days": 1e999, "x": [-1E+400]}<|call|>'}  # fmt: skip


@pytest.mark.parametrize("name", list(PARSERS))
def test_a_number_no_float_holds_stays_as_the_model_wrote_it(name):
    (call,) = parse_whole(HUGE[name], lambda: PARSERS[name](NAMES))[1]
    assert "Infinity" not in call.arguments and "1e999" in call.arguments and "-1E+400" in call.arguments
    assert strict_loads(call.arguments) == {"city": "Oslo", "days": float("inf"), "x": [float("-inf")]}


def test_json_literals_python_accepts_but_json_does_not_are_no_call():
    for body in ('{"city": NaN}', '{"city": Infinity}', '{"days": -Infinity}'):
        text = f'<tool_call>\n{{"name": "get_weather", "arguments": {body}}}\n</tool_call>'
        assert parse_whole(text, lambda: PARSERS["hermes"](NAMES)) == (text, [])


def test_exact_json_reads_and_writes_every_number_as_written():
    text = '{"a": 1e999, "b": [-1E+400, 2.5, 3, 0.1], "c": "\\u00e9", "d": ' + "7" * 5000 + "}"
    value = loads(text)
    assert isinstance(value["a"], RawNumber) and value["a"] == float("inf") and value["b"][2:] == [3, 0.1]
    assert dumps(value) == text  # json.dumps' own separators and escapes, every number as read
    assert dumps({"a": 1, "b": "é"}) == json.dumps({"a": 1, "b": "é"})  # the plain path unchanged
    for not_json in ("NaN", '{"a": Infinity}', "[-Infinity]", "{"):
        with pytest.raises(ValueError):
            loads(not_json)
    with pytest.raises(ValueError):  # a non-finite float read from nowhere is a bug, never Infinity
        dumps({"a": float("nan")})
    body = ExactJSONResponse({"input": value, "text": "é"}).body.decode()
    assert dumps(loads(body)["input"]) == text and loads(body)["text"] == "é"
    small = ExactJSONResponse({"input": loads('{"a": 1e999}')}).body  # what Starlette's strict encoder refused
    assert small == b'{"input":{"a":1e999}}' and strict_loads(small) == {"input": {"a": float("inf")}}


# ---- the grammar: a forced reply may end after any complete call --------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", list(PARSERS))
def test_a_forced_reply_may_end_after_any_complete_call(name, smollm2_tokenizer):
    """After each complete call, "required" (several calls), a named function and Anthropic's ``any``
    allow eos: the reply can stop there, never forced on to another call."""
    import torch

    from decoding.structured.compiler import GrammarCompiler

    eos = 2
    compiler = GrammarCompiler(smollm2_tokenizer, 49152, [eos])
    named = NamedToolChoice.model_validate({"type": "function", "function": {"name": "get_weather"}})
    grammars = [call_grammar([WEATHER, TIME], "required", parallel=True, tool_format=name),
                call_grammar([WEATHER, TIME], "required", parallel=False, tool_format=name),
                call_grammar([WEATHER, TIME], named, parallel=True, tool_format=name)]  # fmt: skip
    for spec, calls in zip(grammars, ([OSLO, NOW, OSLO], [OSLO], [OSLO]), strict=True):
        for k in range(1, len(calls) + 1):
            matcher = compiler.compile(spec)[0].new_matcher()
            text = written(name, calls[:k])
            assert matcher.consume_tokens(smollm2_tokenizer.encode(text, add_special_tokens=False)), text
            words = torch.zeros(49152 // 32, dtype=torch.int32)
            matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * 4)
            assert (int(words[eos // 32]) >> (eos % 32)) & 1, f"eos refused after {k} calls: {text!r}"


# ---- every API -------------------------------------------------------------------------------------------
FIRST = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
SECOND = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 1e999}}\n</tool'
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
ANTHROPIC_TOOL = {"name": "get_weather", "input_schema": {"type": "object"}}


class CutEngine(RecordingEngine):
    """Replies ``reply`` in a few deltas, cut by the length limit."""

    async def _scripted(self, request_id: str, prompt_ids: list[int]) -> AsyncIterator[RequestOutput]:
        text, size = self.reply or "", 9
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            delta = SequenceDelta(0, piece, [i + 1], None, FinishReason.LENGTH if last else None)
            yield RequestOutput(request_id, [delta], len(prompt_ids), i + 1, finished=last)


def request_of(api: str, stream: bool) -> tuple[str, dict]:
    ask = [{"role": "user", "content": "Weather in Oslo and Rome?"}]
    if api == "chat":
        return "/v1/chat/completions", {"messages": ask, "tools": [CHAT_TOOL], "tool_choice": "required",
                                        "max_tokens": 40, "stream": stream}  # fmt: skip
    if api == "messages":
        return "/v1/messages", {"messages": ask, "tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "any"},
                                "max_tokens": 40, "stream": stream}  # fmt: skip
    return "/v1/responses", {"input": "Weather in Oslo and Rome?", "tools": [{"type": "function", **CHAT_TOOL[
        "function"]}], "tool_choice": "required", "max_output_tokens": 40, "stream": stream}  # fmt: skip


def calls_and_ending(api: str, stream: bool, text: str) -> tuple[list[tuple[str, object]], str]:
    """(name, arguments) of each call the API reported, and how it said the reply ended; every body,
    event and arguments string is strict JSON."""
    if not stream:
        body = strict_loads(text)
        if api == "chat":
            choice = body["choices"][0]
            calls = [(c["function"]["name"], strict_loads(c["function"]["arguments"]))
                     for c in choice["message"]["tool_calls"]]  # fmt: skip
            return calls, choice["finish_reason"]
        if api == "messages":
            blocks = [b for b in body["content"] if b["type"] == "tool_use"]
            return [(b["name"], b["input"]) for b in blocks], body["stop_reason"]
        items = [i for i in body["output"] if i["type"] == "function_call"]
        return [(i["name"], strict_loads(i["arguments"])) for i in items], body["status"]
    payloads = [strict_loads(line[len("data: ") :]) for line in text.splitlines()
                if line.startswith("data: ") and line != "data: [DONE]"]  # fmt: skip
    if api == "chat":
        calls: dict[int, list[str]] = {}
        for payload in payloads:
            for part in payload["choices"][0]["delta"].get("tool_calls") or []:
                name, arguments = calls.setdefault(part["index"], ["", ""])
                calls[part["index"]] = [name + part["function"].get("name", ""),
                                        arguments + part["function"]["arguments"]]  # fmt: skip
        return [(name, strict_loads(arguments)) for name, arguments in calls.values()], payloads[-1]["choices"][0][
            "finish_reason"]  # fmt: skip
    if api == "messages":
        starts = [p["content_block"] for p in payloads if p["type"] == "content_block_start"]
        arguments = [p["delta"]["partial_json"] for p in payloads if p["type"] == "content_block_delta"
                     and p["delta"]["type"] == "input_json_delta"]  # fmt: skip
        names = [b["name"] for b in starts if b["type"] == "tool_use"]
        (stop,) = [p["delta"]["stop_reason"] for p in payloads if p["type"] == "message_delta"]
        return list(zip(names, map(strict_loads, arguments), strict=True)), stop
    done = [p["item"] for p in payloads if p["type"] == "response.output_item.done"]
    calls = [(i["name"], strict_loads(i["arguments"])) for i in done if i["type"] == "function_call"]
    return calls, payloads[-1]["response"]["status"]


ENDING = {"chat": "length", "messages": "max_tokens", "responses": "incomplete"}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_every_api_keeps_the_finished_calls_of_a_cut_reply_and_writes_valid_json(api, stream, tmp_path: Path):
    path, body = request_of(api, stream)
    for reply, expected in [
        (FIRST + SECOND, [("get_weather", '{"city": "Oslo"}'), ("get_weather", '{"city": "Rome", "days": 1e999}')]),
        (FIRST + SECOND[:-40], [("get_weather", '{"city": "Oslo"}')]),  # cut inside the second's arguments
        (FIRST[: -len("</tool_call>\n")], [("get_weather", '{"city": "Oslo"}')]),  # inside the first's end tag
    ]:
        response = Server(tmp_path, CutEngine(reply)).call("POST", path, body)
        assert response.status_code == 200, response.text
        calls, ending = calls_and_ending(api, stream, response.text)
        assert calls == [(name, json.loads(arguments)) for name, arguments in expected], reply
        assert "Infinity" not in response.text and ending == ENDING[api]
