"""Tool calls written as JSON outside the hermes tags (``server.output.tool_formats.json_calls``), as Qwen 2.5
writes them: fenced (```` ```json ````, ```` ``` ````, ```` ```tool_call ````) or bare, one object or an array,
several in one reply, prose before and after kept as content; and everything that only looks like JSON
staying content (prose examples naming no offered tool, an unoffered name, other keys, code blocks,
malformed JSON, a call-like object nested in unrelated data). Whole and streamed in every split, with no
call text in a content delta and prose released as it comes; a reply cut inside such a call; the hermes
grammar under "auto" holding these calls to their schemas while leaving other JSON free."""

from __future__ import annotations

import json

import pytest

from server.output.tool_formats.calls import parse_whole
from server.output.tool_formats.hermes import HermesStream
from server.output.tool_formats.json_calls import Head, head, json_calls
from server.translate.tools import Tool, call_grammar
from tests.test_tool_formats import WEATHER, accepts, splits  # noqa: F401 (accepts: a fixture)

NAMES = ["get_weather", "get_time"]
TIME = Tool.model_validate({"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}})  # fmt: skip
PARIS, ROME, NOW = ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"}), ("get_time", {})
PRETTY_PARIS = '{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}'

# (reply, content, calls)
CALLS = [
    ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```', None, [PARIS]),  # the reply
    (f"```json\n{PRETTY_PARIS}\n```", None, [PARIS]),
    (f"```\n{PRETTY_PARIS}\n```", None, [PARIS]),
    ('```tool_call\n{"name": "get_time", "arguments": {}}\n```', None, [NOW]),
    ('```json {"name": "get_weather", "arguments": {"city": "Paris"}} ```', None, [PARIS]),
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', None, [PARIS]),
    ('  {"name":"get_weather","parameters":{"city":"Paris"}}\n', None, [PARIS]),
    ('{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}', None, [PARIS]),  # OpenAI's string form
    ('[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]',
     None, [PARIS, NOW]),
    ('```json\n[\n  {"name": "get_weather", "arguments": {"city": "Paris"}},\n  {"name": "get_weather", "arguments": '
     '{"city": "Rome"}}\n]\n```', None, [PARIS, ROME]),
    ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n{"name": "get_weather", "arguments": '
     '{"city": "Rome"}}\n```', None, [PARIS, ROME]),
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}\n{"name": "get_time", "arguments": {}}', None,
     [PARIS, NOW]),
    ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\n\n```json\n{"name": "get_time", '
     '"arguments": {}}\n```', None, [PARIS, NOW]),
    (f"To get the weather, I'll call the tool:\n```json\n{PRETTY_PARIS}\n```", "To get the weather, I'll call the "
     "tool:", [PARIS]),
    (f"Sure.\n{PRETTY_PARIS}\nI will tell you once I know.", "Sure.\nI will tell you once I know.", [PARIS]),
    ('Both: <tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n```json\n{"name": "get_weather", '
     '"arguments": {"city": "Paris"}}\n```', "Both:", [NOW, PARIS]),  # tags and JSON in one reply
    ('{"name": "get_weather", "arguments": {"city": "a}b{c\\"d]"}}', None, [("get_weather", {"city": 'a}b{c"d]'})]),
    ('```json\n{"name": "get_weather", "arguments": {"city": "```\\n}"}}\n```', None,
     [("get_weather", {"city": "```\n}"})]),  # a fence and a brace inside a string end nothing
    ('Use {x} or [y] then {"name": "get_time", "arguments": {}}', "Use {x} or [y] then", [NOW]),
    ('<tool_call>\n[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]'
     "\n</tool_call>", None, [PARIS, NOW]),  # several in one tag
    ('<tool_call>\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\n</tool_call>', None, [PARIS]),
]  # fmt: skip

# replies that are content, whole, however they are split
NOT_CALLS = [
    'Here is an example: {"name": "Alice", "age": 30}.',
    '```json\n{\n  "name": "Alice",\n  "age": 30\n}\n```',
    '```json\n{"name": "rm_rf", "arguments": {}}\n```',  # a function never offered
    '{"name": "get_weather_report", "arguments": {"city": "Paris"}}',  # an offered name's prefix is not it
    '{"name": "get_weather", "description": "Get the weather", "parameters": {"type": "object"}}',  # other keys
    '{"name": "get_weather"}',  # no arguments: outside tags, JSON names a call only with them
    '{"name": "get_weather", "arguments": [1, 2]}',
    '{"name": "get_weather", "arguments": {"city": "Paris"},}',  # malformed: a trailing comma
    "{'name': 'get_weather', 'arguments': {'city': 'Paris'}}",  # not JSON
    '```python\ncall = {"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
    '```json\n{"tool": {"name": "get_weather", "arguments": {"city": "Paris"}}}\n```',
    '{"calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}',  # call-like data nested in data
    '[1, {"name": "get_weather", "arguments": {"city": "Paris"}}]',
    '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "Bob"}]',  # every item or none
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\nThat is how you would call it.\n```',
    "A [link](https://x.io), `code`, ```inline``` and - [ ] a task {not json} ] } [",
    "An unmatched { brace\n\nthen more text [with brackets",
    'Inline code: `{"name": "get_weather", "arguments": {"city": "Paris"}}` is how a call looks.',
    '```Json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',  # a language the grammar leaves free
]  # fmt: skip


def calls_of(calls) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments)) for call in calls]


def streamed(pieces: list[str], truncated: bool = False, names=NAMES) -> tuple[list[str], list]:
    """Each piece's released content, and every call, fed piece by piece."""
    stream, contents, calls = HermesStream(names), [], []
    for piece in pieces:
        content, found = stream.feed(piece)
        contents.append(content)
        calls += found
    content, found = stream.finish(truncated)
    return [*contents, content], calls + found


@pytest.mark.parametrize(("text", "content", "expected"), CALLS)
def test_json_calls_are_read_whole_and_streamed(text, content, expected):
    whole_content, calls = parse_whole(text, lambda: HermesStream(NAMES))
    assert (whole_content, calls_of(calls)) == (content, expected)
    for pieces in splits(text, seed=len(text)):
        contents, calls = streamed(pieces)
        assert calls_of(calls) == expected, pieces
        assert ("".join(contents).strip() or None) == content, pieces
        for piece in contents:
            assert '"name"' not in piece and "<tool_call>" not in piece and "```" not in piece, pieces


@pytest.mark.parametrize("text", NOT_CALLS)
def test_json_that_is_not_an_offered_call_stays_content(text):
    assert parse_whole(text, lambda: HermesStream(NAMES)) == (text, [])
    for pieces in splits(text, seed=len(text)):
        contents, calls = streamed(pieces)
        assert ("".join(contents), calls) == (text, []), pieces


def test_prose_streams_as_it_comes_and_a_block_that_is_no_call_is_released_once_it_tells():
    stream = HermesStream(NAMES)
    assert stream.feed("The weather") == ("The weather", [])
    assert stream.feed(" is {") == (" is ", [])  # a brace may open a call: held
    assert stream.feed("x} nice") == ("{x} nice", [])
    assert stream.feed(" ```json\n{") == (" ", [])
    assert stream.feed('"name": "Al') == ('```json\n{"name": "Al', [])  # no offered name starts with "Al"
    assert HermesStream(NAMES).feed('```json\n{"name": "Al') == ('```json\n{"name": "Al', [])
    stream = HermesStream(NAMES)
    assert stream.feed('```json\n{"name": "get_') == ("", [])  # may become get_weather or get_time
    assert stream.feed('weather", "arguments": {"city": "Paris"}}\n') == ("", [])  # held to the closing fence
    assert calls_of(stream.feed("```")[1]) == [PARIS]
    stream = HermesStream(NAMES)
    assert stream.feed('{"name": "get_weather", "extra": 1, "arguments": {}}') == (
        '{"name": "get_weather", "extra": 1, "arguments": {}}', [])  # fmt: skip


def test_a_code_block_that_is_no_call_streams_as_content_up_to_its_end():
    stream = HermesStream(NAMES)
    assert stream.feed("```python\nx = {") == ("```python\nx = {", [])  # code is not held, braces and all
    body = '"name": "get_weather", "arguments": {}}\n'
    assert stream.feed(body + "``") == (body, [])
    assert stream.feed("`\n") == ("```\n", [])
    assert calls_of(stream.feed('{"name": "get_time", "arguments": {}}')[1]) == [NOW]  # after it, calls again


def test_a_tag_is_a_call_even_inside_a_code_block_which_goes_on_after_it():
    text = '```\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n```\nand {"x": 1}'
    content, calls = parse_whole(text, lambda: HermesStream(NAMES))
    assert calls_of(calls) == [NOW] and content == '```\n\n```\nand {"x": 1}'
    for pieces in splits(text, seed=3):
        contents, calls = streamed(pieces)
        assert calls_of(calls) == [NOW] and "".join(contents) == '```\n\n```\nand {"x": 1}', pieces


def test_without_offered_names_only_tags_are_calls():
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert parse_whole(text, lambda: HermesStream(None)) == (text, [])
    assert calls_of(parse_whole(f"<tool_call>{text}</tool_call>", lambda: HermesStream(None))[1]) == [PARIS]


CUT = [  # (a reply cut by max_tokens, the calls kept): the one it was cut in is dropped, never content
    ('```json\n{"name": "get_time", "arguments": {}}\n```\n```json\n{"name": "get_weather", "arguments": {"ci', [NOW]),
    ('{"name": "get_time", "arguments": {}}\n{"name": "get_wea', [NOW]),
    ('[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Pa', []),
    ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n`', [PARIS]),  # whole before its fence
    ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}', [PARIS]),
    ('```json\n{"name": "get_', []),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), CUT)
def test_a_reply_cut_inside_a_json_call_drops_it_and_keeps_the_finished_ones(text, expected):
    content, calls = parse_whole(text, lambda: HermesStream(NAMES), truncated=True)
    assert calls_of(calls) == expected and not content
    for pieces in splits(text, seed=len(text)):
        contents, calls = streamed(pieces, truncated=True)
        assert calls_of(calls) == expected and not "".join(contents).strip(), pieces


def test_a_reply_ended_inside_an_unfinished_json_call_is_content():
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}'  # the model stopped with a brace missing
    assert parse_whole(text, lambda: HermesStream(NAMES)) == (text, [])


NO_HEADS = ["{x", '{"age"', '{"name": 3', '{"name": "Bob', '{"name": "get_time_zone"', "[1", "[[", "{" + " " * 299]


def test_head_tells_as_early_as_the_text_allows():
    assert [head(text, NAMES) for text in ("{", '{ "na', '[\n {"name" :', '{"name": "get_')] == [Head.OPENING] * 3 + [
        Head.NAMING]  # fmt: skip
    assert head('{"name": "get_time"', NAMES) is Head.CALL and head('[{"name":"get_weather"', NAMES) is Head.CALL
    for text in NO_HEADS:
        assert head(text, NAMES) is Head.NOT_CALL, text
    assert json_calls('{"name": "get_time", "arguments": {}} ; [{"name": "get_time", "parameters": {}}]', NAMES)
    assert json_calls('{"name": "get_time", "arguments": {}} and more', NAMES) is None


def test_an_open_json_call_is_scanned_once_however_small_the_deltas():
    stream = HermesStream(NAMES)
    stream.feed('```json\n{"name": "get_weather", "arguments": {"city": "')
    for _ in range(5_000):
        assert stream.feed("ab`{") == ("", [])
        assert stream._scanned >= len(stream._pending) - 1  # never rescanned from the start
    assert calls_of(stream.feed('"}}\n```')[1]) == [("get_weather", {"city": "ab`{" * 5_000})]


# ---- the grammar under "auto" ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_auto_grammar_holds_json_calls_to_their_schema_and_leaves_other_json_free(accepts):  # noqa: F811
    auto = call_grammar([WEATHER, TIME], "auto", parallel=True)
    for text in ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\nDone.',
                 f"Sure:\n```json\n{PRETTY_PARIS.replace(chr(10) + '    ', '').replace(chr(10) + '  }', '}')}\n```",
                 '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]',
                 'Example: {"name": "Alice", "age": 30}', '```json\n{"name": "rm_rf", "arguments": 3}\n```',
                 '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'):  # fmt: skip
        assert accepts(auto, text), text
    for text in ('{"name": "get_weather", "arguments": {"city": 3}}',  # off the schema
                 '```json\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n```',  # the required city missing
                 '{"name": "get_weather", "description": "weather"}'):  # fmt: skip
        assert not accepts(auto, text), text
    lone = call_grammar([WEATHER, TIME], "auto", parallel=False)
    one = '```json\n[{"name": "get_weather", "arguments": {"city": "Paris"}}]\n```'
    assert accepts(lone, one) and accepts(lone, "No call.")
    assert not accepts(lone, '{"name": "get_time", "arguments": {}}\n{"name": "get_time", "arguments": {}}')
    for text in ('```python\nreturn {"name": "get_weather", "arguments": {"city": city}}\n```',  # code: free
                 '`{"name": "get_weather", "arguments": 3}`', '{"name": "get_weatherly", "x": 1}',
                 '```json\n{"name": "Alice", "age": 30}\n```\nthen {"name": "get_time", "arguments": {}}'):  # fmt: skip
        assert accepts(auto, text), text
    for text in ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\nthat is all\n```',  # calls only
                 '```json\n{"name": "Alice", "age": 30}\n```\nthen {"name": "get_time", "arguments": 3}'):  # fmt: skip
        assert not accepts(auto, text), text
    strict = Tool.model_validate({"type": "function", "function": {**WEATHER.function.model_dump(), "strict": True}})
    closed = call_grammar([strict], "auto", parallel=True)
    assert not accepts(closed, '{"name": "get_weather", "arguments": {"city": "Paris", "x": 1}}')
    assert accepts(call_grammar([WEATHER], "auto", True), '{"name": "get_weather", "arguments": {"city": "P", "x": 1}}')


@pytest.mark.slow
def test_the_json_triggers_do_not_grow_with_the_tools_a_mask_at_every_token_with_128(smollm2_tokenizer):
    """One lazy lexeme per tool and form exhausted llguidance's lexer at 16 tools ("too many expressions
    constructed" where ``{"name": "`` was written); three triggers and the names after them hold 128."""
    import llguidance.numpy

    from decoding.structured.compiler import GrammarCompiler

    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    tools = [Tool.model_validate({"type": "function", "function": {"name": f"tool_{i}", "parameters": schema}})
             for i in range(128)]  # fmt: skip
    matcher = GrammarCompiler(smollm2_tokenizer, 49152, [2]).compile(call_grammar(tools, "auto", True))[0].new_matcher()
    mask = llguidance.numpy.allocate_token_bitmask(1, 49152)
    text = 'Prose {"name": "Bob", "x": 1}, then:\n```json\n{"name": "tool_99", "arguments": {"a": "x"}}\n```\nDone.'
    for token in smollm2_tokenizer.encode(text, add_special_tokens=False):
        llguidance.numpy.fill_next_token_bitmask(matcher, mask, 0)
        assert matcher.consume_token(token), matcher.get_error()
    assert matcher.is_accepting()
