"""Every tool-call format of ``server.output.tool_formats``: replies as each family documents them,
parsed whole and streamed (the same calls and content however the text is split), malformed output
kept as content, a call cut short dropped; each format's grammar accepting valid calls and refusing
invalid ones (and the parser reading back what it accepts); ``--tool-call-parser auto`` from chat
templates; and one end-to-end request whose forced call is written and read in the pythonic format."""

from __future__ import annotations

import json
import logging
import random

import pytest

from decoding.params.structured import StructuredOutput
from server.config.settings import Settings
from server.output.tool_formats import FORMATS, detect_format
from server.output.tool_parser import PARSERS, check_parser, parse_whole, resolve_parser
from server.translate.tools import NamedToolChoice, Tool, call_grammar

NAMES = ["get_weather", "get_time"]
WEATHER = Tool.model_validate({"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "metric": {"type": "boolean"}},
    "required": ["city"]}}})  # fmt: skip
TIME = Tool.model_validate({"type": "function", "function": {"name": "get_time"}})
OSLO, ROME, NOW = ("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "Rome", "days": 2}), ("get_time", {})

# (format, reply, content, calls): each family's documented output
REPLIES = [
    ("hermes", 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
     "Checking.", [OSLO]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Oslo"}}', None, [OSLO]),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome", "days": 2}}; '
                    '{"name": "get_time", "parameters": {}}', None, [ROME, NOW]),
    ("llama3_json", "It is sunny in {Oslo} today.", "It is sunny in {Oslo} today.", []),
    ("pythonic", '[get_weather(city="Oslo"), get_time()]', None, [OSLO, NOW]),
    ("pythonic", "<|python_start|>[get_weather(city='Rome', days=2)]<|python_end|>", None, [ROME]),
    ("pythonic", "[1, 2, 3] are numbers", "[1, 2, 3] are numbers", []),
    ("mistral", 'Sure.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
                '{"name": "get_time", "arguments": {}}]', "Sure.", [OSLO, NOW]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome", "days": 2}[TOOL_CALLS]get_time[ARGS]{}',
     None, [ROME, NOW]),
    ("mistral", '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Oslo"}', None, [OSLO]),
    ("openai", "<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant<|channel|>"
               'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>',
     "The user wants the weather.", [OSLO]),
    ("openai", '<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}', None, [NOW]),
    ("openai", "<|channel|>final<|message|>It is sunny.<|return|>", "It is sunny.", []),
]  # fmt: skip

# (format, text that looks like a call but is not one of the offered functions with object arguments)
NOT_CALLS = [
    ("hermes", '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'),
    ("llama3_json", '{"name": "get_weather", "parameters": [1]}'),
    ("llama3_json", '{"answer": 42}'),
    ("pythonic", "[rm_rf(path='/')]"),
    ("pythonic", "[get_weather('Oslo')]"),  # positional: not a keyword call
    ("mistral", '[TOOL_CALLS][{"name": "rm_rf", "arguments": {}}]'),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]"Oslo"'),
    ("openai", '<|channel|>commentary to=functions.rm_rf <|constrain|>json<|message|>{}<|call|>'),
]  # fmt: skip

# (format, a reply cut inside its second call): the first call stands, the cut one is dropped
CUT = [
    ("hermes", '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "get_we'),
    ("llama3_json", '{"name": "get_time", "parameters": {}}; {"name": "get_weather", "parameters": {"ci'),
    ("pythonic", '[get_time(), get_weather(city="Os'),
    ("mistral", '[TOOL_CALLS][{"name": "get_time", "arguments": {}}, {"name": "get_weather", "argu'),
    ("openai", '<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|call|><|start|>'
               'assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"ci'),
]  # fmt: skip


def calls_of(calls) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments)) for call in calls]


def streamed(name: str, text: str, pieces: list[str], truncated: bool = False) -> tuple[str, list]:
    stream, content, calls = PARSERS[name](NAMES), "", []
    for piece in pieces:
        more, new = stream.feed(piece)
        content, calls = content + more, calls + new
    more, new = stream.finish(truncated)
    return content + more, calls + new


def splits(text: str, seed: int) -> list[list[str]]:
    """The text whole, one character at a time, and in random pieces."""
    rng, cuts = random.Random(seed), []
    for _ in range(3):
        points = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 8))))
        cuts.append([text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)])
    return [[text], list(text), *cuts]


@pytest.mark.parametrize(("name", "text", "content", "expected"), REPLIES)
def test_each_format_reads_its_family_s_replies_whole_and_streamed(name, text, content, expected):
    whole_content, whole_calls = parse_whole(text, lambda: PARSERS[name](NAMES))
    assert (whole_content, calls_of(whole_calls)) == (content, expected)
    for seed, pieces in enumerate(splits(text, seed=len(text))):
        streamed_content, streamed_calls = streamed(name, text, pieces)
        assert calls_of(streamed_calls) == expected, (seed, pieces)
        assert (streamed_content.strip() or None) == (content.strip() if content else None), (seed, pieces)
        for marker in ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "<|channel|>", "<|message|>"):
            assert marker not in streamed_content  # no call text leaks into content


@pytest.mark.parametrize(("name", "text"), NOT_CALLS)
def test_what_is_not_an_offered_call_stays_content(name, text):
    assert parse_whole(text, lambda: PARSERS[name](NAMES)) == (text, [])
    assert streamed(name, text, list(text)) == (text, [])


@pytest.mark.parametrize(("name", "text"), CUT)
def test_a_reply_cut_inside_a_call_drops_that_call_and_keeps_the_ones_before(name, text):
    content, calls = parse_whole(text, lambda: PARSERS[name](NAMES), truncated=True)
    assert calls_of(calls) == [NOW] and content is None
    assert calls_of(streamed(name, text, list(text), truncated=True)[1]) == [NOW]


# ---- the grammars ------------------------------------------------------------------------------------
def written(name: str, calls: list[tuple[str, dict]]) -> str:
    """``calls`` as the format's grammar writes them (compact JSON, its separators)."""
    fmt = FORMATS[name]

    def one(function: str, arguments: dict) -> str:
        if name == "hermes":
            return "\n" + json.dumps({"name": function, "arguments": arguments}) + "\n"
        if name == "llama3_json":
            return json.dumps({"name": function, "parameters": arguments})
        if name == "mistral":
            return json.dumps({"name": function, "arguments": arguments})
        if name == "openai":
            return f"{function} <|constrain|>json<|message|>{json.dumps(arguments)}"
        keywords = ", ".join(f"{k}={json.dumps(v) if not isinstance(v, bool) else v}" for k, v in arguments.items())
        return f"{function}({keywords})"

    if fmt.call_per_group:
        return fmt.separator.join(fmt.opener + one(*call) + fmt.closer for call in calls)
    return fmt.opener + fmt.separator.join(one(*call) for call in calls) + fmt.closer


@pytest.fixture(scope="module")
def accepts(smollm2_tokenizer):
    from decoding.structured.compiler import GrammarCompiler

    compiler = GrammarCompiler(smollm2_tokenizer, 49152, [2])

    def accepts(spec: StructuredOutput, text: str) -> bool:
        matcher = compiler.compile(spec)[0].new_matcher()
        ok = all(matcher.consume_token(t) for t in smollm2_tokenizer.encode(text, add_special_tokens=False))
        return ok and matcher.is_accepting()

    return accepts


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FORMATS))
def test_each_format_s_grammar_forces_valid_calls_that_its_parser_reads_back(name, accepts):
    tools = [WEATHER, TIME]
    full = ("get_weather", {"city": "Oslo", "days": 3, "metric": True})
    one, two = written(name, [OSLO]), written(name, [full, NOW])
    required = call_grammar(tools, "required", parallel=True, tool_format=name)
    assert accepts(required, one) and accepts(required, two)
    assert calls_of(parse_whole(two, lambda: PARSERS[name](NAMES))[1]) == [full, NOW]  # read back
    assert not accepts(required, "It is sunny.")  # required: a call, not text
    assert not accepts(required, written(name, [("get_wether", {"city": "Oslo"})]))  # a name never offered
    assert not accepts(required, written(name, [("get_weather", {"days": 3})]))  # the required city missing
    assert not accepts(required, written(name, [("get_weather", {"city": 3})]))  # off the schema
    single = call_grammar(tools, "required", parallel=False, tool_format=name)
    assert accepts(single, one) and not accepts(single, two)
    named = call_grammar(tools, NamedToolChoice.model_validate({"type": "function", "function": {"name": "get_time"}}),
                         parallel=True, tool_format=name)  # fmt: skip
    assert accepts(named, written(name, [NOW])) and not accepts(named, one)
    auto = call_grammar(tools, "auto", parallel=True, tool_format=name)
    assert accepts(auto, "It is sunny.") and accepts(auto, one) and accepts(auto, two)
    assert not accepts(auto, written(name, [("get_weather", {"city": 3})]))  # a call it opens must be valid
    assert not accepts(auto, one[: len(one) // 2 + 5])  # an open call cannot end the reply
    lone = call_grammar(tools, "auto", parallel=False, tool_format=name)
    assert accepts(lone, one) and accepts(lone, "No call.") and not accepts(lone, two)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FORMATS))
def test_strict_functions_admit_only_the_properties_they_name(name, accepts):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "o": {"type": "object"}}}
    loose = Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": schema}})
    strict = Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": schema, "strict": True}})
    extra = written(name, [("f", {"a": 1, "o": {"x": 1}})])  # strict closes nested objects too
    assert accepts(call_grammar([loose], "required", True, tool_format=name), extra)
    assert not accepts(call_grammar([strict], "required", True, tool_format=name), extra)
    assert accepts(call_grammar([strict], "required", True, tool_format=name), written(name, [("f", {"a": 1})]))


@pytest.mark.slow
def test_under_auto_an_anchored_format_s_reply_is_calls_or_text_that_cannot_open_like_one(accepts):
    tools = [WEATHER, TIME]
    llama = call_grammar(tools, "auto", parallel=True, tool_format="llama3_json")
    assert not accepts(llama, '{"name": "get_weather", "parameters": {"city": 3}}')
    assert not accepts(llama, '  {"name": "get_weather"}')  # whitespace first still opens a call
    pythonic = call_grammar(tools, "auto", parallel=True, tool_format="pythonic")
    assert not accepts(pythonic, "[get_weather(town='Oslo')]") and accepts(pythonic, "Sunny [mostly].")


# ---- --tool-call-parser auto ---------------------------------------------------------------------------
TEMPLATES = {  # small templates writing each family's markers, as their real ones do
    "hermes": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
              "{% if tools %}Return calls in <tool_call></tool_call> tags.{% endif %}",
    "llama3_json": "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>"
                   "{% if m.tool_calls %}<|python_tag|>{{ m.tool_calls | tojson }}{% endif %}<|eot_id|>{% endfor %}",
    "pythonic": "{% for m in messages %}<|header_start|>{{ m.role }}<|header_end|>{% if m.tool_calls %}"
                "<|python_start|>[...]<|python_end|>{% endif %}<|eot|>{% endfor %}",
    "mistral": "{% for m in messages %}{% if m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | tojson }}</s>"
               "{% else %}[INST] {{ m.content }} [/INST]{% endif %}{% endfor %}",
    "openai": "{% for m in messages %}<|start|>{{ m.role }}{% if m.tool_calls %} to=functions.{{ m.name }}"
              "<|channel|>commentary json<|message|>{{ m.args }}<|call|>{% endif %}<|end|>{% endfor %}",
}  # fmt: skip


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_auto_picks_the_format_whose_markers_the_chat_template_writes(name):
    assert detect_format(TEMPLATES[name]) == name
    said = f"tool calls are read as {name} (--tool-call-parser auto): the chat template writes its markers"
    assert resolve_parser("auto", TEMPLATES[name]) == (name, said)


def test_auto_falls_back_to_hermes_and_says_why_and_a_named_parser_stays():
    plain = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert resolve_parser("auto", plain) == ("hermes", "tool calls are read as hermes (--tool-call-parser auto): "
                                                       "the chat template writes no known call markers")  # fmt: skip
    assert resolve_parser("auto", None)[1].endswith("the model has no chat template")
    assert resolve_parser("pythonic", TEMPLATES["mistral"])[0] == "pythonic"


def test_every_format_and_auto_are_known_settings():
    for name in [*FORMATS, "auto"]:
        check_parser(name)
        Settings(tool_call_parser=name).check()
    with pytest.raises(ValueError, match="auto, hermes, llama3_json, pythonic, mistral, openai"):
        check_parser("harmonyx")


def test_the_app_resolves_auto_at_start_from_the_engine_s_template(caplog):
    from fastapi.testclient import TestClient

    from server.app import create_app
    from tests.fake_engine import FakeEngineClient

    class MistralEngine(FakeEngineClient):
        def chat_template_source(self) -> str | None:
            return TEMPLATES["mistral"]

    settings = Settings(tool_call_parser="auto")
    with caplog.at_level(logging.INFO, logger="server.app"), TestClient(create_app(settings, MistralEngine())):
        assert settings.tool_call_parser == "mistral"
    assert "tool calls are read as mistral (--tool-call-parser auto)" in caplog.text


# ---- end to end ----------------------------------------------------------------------------------------
@pytest.mark.e2e
@pytest.mark.slow
def test_a_forced_call_is_written_and_read_in_the_pythonic_format(smollm2):
    import openai

    from tests.test_e2e_openai import start_server, stop_server

    base, proc = start_server("--max-model-len", "1024", "--tool-call-parser", "pythonic")
    try:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
        tools = [WEATHER.model_dump(exclude_none=True), TIME.model_dump(exclude_none=True)]
        ask = [{"role": "user", "content": "What is the weather in Oslo?"}]
        reply = client.chat.completions.create(model="smollm2-135m-instruct", messages=ask, tools=tools,
                                               tool_choice="required", max_tokens=60, temperature=0)  # fmt: skip
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "tool_calls" and message.content is None
        call = message.tool_calls[0].function
        assert call.name in NAMES and isinstance(json.loads(call.arguments), dict)
        if call.name == "get_weather":
            assert isinstance(json.loads(call.arguments)["city"], str)
        chunks = list(client.chat.completions.create(model="smollm2-135m-instruct", messages=ask, tools=tools,
                                                     tool_choice="required", max_tokens=60, temperature=0,
                                                     stream=True))  # fmt: skip
        pieces = [c for chunk in chunks for c in chunk.choices[0].delta.tool_calls or []]
        assert pieces[0].function.name == call.name
        assert "".join(p.function.arguments or "" for p in pieces) == call.arguments
        assert not any(chunk.choices[0].delta.content for chunk in chunks)
    finally:
        stop_server(proc)
