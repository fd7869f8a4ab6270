"""Tool calling's parts without a model: the request checks, the Hermes parser (whole and streamed),
the grammar that makes "required" and a named function decode into valid calls, the chunks."""

from __future__ import annotations

import json

import pytest

from decoding import ParameterError, RequestOutput, SequenceDelta
from decoding.outputs import FinishReason
from decoding.params.structured import StructuredOutput
from server.api.chat.format import ChatFormat
from server.api.chat.protocol import ChatCompletionRequest
from server.output.collect import Collected
from server.output.tool_parser import HermesStream, check_parser, parse_hermes
from server.translate.tools import Tool, call_grammar

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "Weather in Oslo?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=fields.pop("messages", ASK), **fields)


def test_parse_a_whole_reply():
    assert parse_hermes("plain text") == ("plain text", [])
    content, calls = parse_hermes("Let me look.\n" + CALL + "\n" + CALL.replace("Oslo", "Rome"))
    assert content == "Let me look." and [c.name for c in calls] == ["get_weather", "get_weather"]
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Oslo"}, {"city": "Rome"}]
    assert calls[0].id.startswith("call_") and calls[0].id != calls[1].id
    assert parse_hermes("<tool_call>\nnot json\n</tool_call>") == ("<tool_call>\nnot json\n</tool_call>", [])
    content, calls = parse_hermes('<tool_call>\n{"name": "f", "arguments": {}}')  # cut before the closing tag
    assert content is None and calls[0].name == "f"


def test_a_stream_never_leaks_a_tag_or_call_json_into_content():
    text = "Sure." + CALL + "\n" + CALL
    for size in (1, 3, 7, len(text)):
        stream, content, calls = HermesStream(), "", []
        for start in range(0, len(text), size):
            piece, found = stream.feed(text[start : start + size])
            content += piece
            calls += found
        rest, more = stream.finish()
        assert content + rest == "Sure." and len(calls + more) == 2


def test_chunks_are_what_openai_stream_helpers_assemble():
    fmt = ChatFormat("id", "m", 1, tool_parser=HermesStream)
    deltas = ["Ok. ", CALL[:20], CALL[20:]]
    chunks = []
    for i, text in enumerate(deltas):
        last = i == len(deltas) - 1
        delta = SequenceDelta(index=0, text=text, token_ids=[1], finish_reason=FinishReason.STOP if last else None)
        chunks += fmt.chunks(0, RequestOutput("r", deltas=[delta]))
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    pieces = [p for c in chunks for p in c["choices"][0]["delta"].get("tool_calls", [])]
    assert content == "Ok. "
    assert pieces[0]["id"].startswith("call_") and pieces[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert json.loads("".join(p["function"]["arguments"] for p in pieces)) == {"city": "Oslo"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_streamed_logprobs_equal_the_body_while_the_parser_holds_text_back():
    """Tokens whose text the tool parser holds back keep their logprobs: they go out with the choice's
    next chunk, so the stream carries every entry the body has, in order."""
    from decoding import TokenLogprob

    texts = ["Ok", ". ", "<tool", "_call>\n", CALL[len("<tool_call>\n"):-5], CALL[-5:]]
    entries = [TokenLogprob(token_id=i, token=text, logprob=-0.1 * i) for i, text in enumerate(texts)]
    streamed = ChatFormat("id", "m", 1, logprobs=True, tool_parser=HermesStream)
    whole = ChatFormat("id", "m", 1, logprobs=True, tool_parser=HermesStream)
    chunks, collected = [], Collected()
    for i, (text, entry) in enumerate(zip(texts, entries, strict=True)):
        last = i == len(texts) - 1
        delta = SequenceDelta(index=0, text=text, token_ids=[i], logprobs=[entry],
                              finish_reason=FinishReason.STOP if last else None)  # fmt: skip
        output = RequestOutput("r", deltas=[delta])
        chunks += streamed.chunks(0, output)
        collected.add(output)
    sent = [e["token"] for c in chunks if c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]]
    body = whole.body([collected])["choices"][0]
    assert sent == [e["token"] for e in body["logprobs"]["content"]] == texts
    assert body["finish_reason"] == "tool_calls" and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_the_parser_takes_offered_names_and_object_arguments_only_and_reads_tags_inside_strings():
    names = ["get_weather"]
    assert parse_hermes(CALL.replace("get_weather", "rm_rf"), names) == (CALL.replace("get_weather", "rm_rf"), [])
    as_list = '<tool_call>\n{"name": "get_weather", "arguments": [1, 2]}\n</tool_call>'
    assert parse_hermes(as_list, names) == (as_list, [])  # arguments must be an object
    tricky = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "a</tool_call>b"}}\n</tool_call>'
    for size in (1, 5, len(tricky)):
        stream, calls = HermesStream(names), []
        for start in range(0, len(tricky), size):
            piece, found = stream.feed(tricky[start : start + size])
            assert piece == ""
            calls += found
        assert [json.loads(c.arguments) for c in calls] == [{"city": "a</tool_call>b"}]


def test_an_open_call_is_scanned_once_however_small_the_deltas():
    stream = HermesStream()
    stream.feed('<tool_call>\n{"name": "f", "arguments": {"text": "')
    for _ in range(5_000):
        assert stream.feed("ab<c") == ("", [])
        assert stream._scan.scanned >= len(stream._pending) - len("</tool_call>")  # never rescanned from 0
    assert stream.feed('"}}\n</tool_call>')[1][0].name == "f"


def test_a_reply_cut_mid_call_says_length_and_drops_the_unfinished_call():
    text = "Checking. " + CALL + "\n" + CALL[:35]
    for streamed in (True, False):
        fmt = ChatFormat("id", "m", 1, tool_parser=HermesStream)
        pieces = [text[:20], text[20:60], text[60:]]
        collected, chunks = Collected(), []
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            delta = SequenceDelta(index=0, text=piece, token_ids=[i],
                                  finish_reason=FinishReason.LENGTH if last else None)  # fmt: skip
            output = RequestOutput("r", deltas=[delta])
            chunks += fmt.chunks(0, output) if streamed else []
            collected.add(output)
        if streamed:
            content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
            calls = [p for c in chunks for p in c["choices"][0]["delta"].get("tool_calls", []) if "id" in p]
            reason = chunks[-1]["choices"][0]["finish_reason"]
        else:
            choice = fmt.body([collected])["choices"][0]
            message, reason = choice["message"], choice["finish_reason"]
            content, calls = message["content"], message["tool_calls"]
        assert "<tool_call>" not in content and content.strip() == "Checking."
        assert len(calls) == 1 and reason == "length"


def test_a_legacy_functions_request_gets_its_call_as_function_call():
    """OpenAI's old function calling answers ``message.function_call`` and ``finish_reason:
    "function_call"``, streamed as ``delta.function_call`` pieces: a client of that API reads them."""
    text = "Ok. " + CALL
    streamed, whole, collected, chunks = (ChatFormat("id", "m", 1, tool_parser=HermesStream, legacy_functions=True),
                                          ChatFormat("id", "m", 1, tool_parser=HermesStream, legacy_functions=True),
                                          Collected(), [])  # fmt: skip
    for i, piece in enumerate((text[:9], text[9:])):
        delta = SequenceDelta(index=0, text=piece, token_ids=[i], finish_reason=FinishReason.STOP if i else None)
        output = RequestOutput("r", deltas=[delta])
        chunks += streamed.chunks(0, output)
        collected.add(output)
    choice = whole.body([collected])["choices"][0]
    assert choice["finish_reason"] == "function_call" and "tool_calls" not in choice["message"]
    assert choice["message"]["function_call"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    pieces = [c["choices"][0]["delta"]["function_call"] for c in chunks if "function_call" in c["choices"][0]["delta"]]
    assert pieces[0] == {"name": "get_weather", "arguments": ""}
    assert "".join(p["arguments"] for p in pieces) == '{"city": "Oslo"}'
    assert chunks[-1]["choices"][0]["finish_reason"] == "function_call"


def test_request_checks_name_the_field():
    cases = [
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"messages": [{"role": "tool", "content": "3"}]}, "messages"),
    ]
    for fields, param in cases:
        with pytest.raises(ParameterError) as error:
            body = request(**fields)
            body.params({})
            body.messages_or_error()
        assert error.value.param == param, fields
    with pytest.raises(ValueError, match="hermes"):
        check_parser("mistral-ish")


def test_tool_turns_reach_the_template_with_objects_for_arguments():
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 3}'},
    ]  # fmt: skip
    rendered = request(messages=messages, tools=[WEATHER]).messages_or_error()
    assert rendered[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert rendered[2] == {"role": "tool", "content": '{"temp": 3}', "tool_call_id": "c1"}


def test_required_with_a_response_format_constrains_this_reply_to_calls():
    """The agents' pattern (force a tool, typed final answer): the reply is calls, the format is the next turn's."""
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    required = request(tools=[WEATHER], tool_choice="required", response_format=fmt).params({})
    assert required.structured_output.param == "tool_choice"
    assert required.structured_output == request(tools=[WEATHER], tool_choice="required").params({}).structured_output


def test_required_and_named_constrain_the_reply_and_none_offers_nothing():
    auto = request(tools=[WEATHER]).params({}).structured_output  # auto: the model decides whether to call...
    assert auto.param == "tools" and "text_then_tag[lazy]" in auto.value  # ...and a call it opens is enforced
    required = request(tools=[WEATHER, TIME], tool_choice="required").params({})
    assert required.structured_output.param == "tool_choice" and not required.skip_special_tokens
    assert request(tools=[WEATHER], tool_choice="none").template_tools() is None


def test_the_call_grammar_accepts_valid_calls_only(smollm2_tokenizer):
    from decoding.structured.compiler import GrammarCompiler

    compiler = GrammarCompiler(smollm2_tokenizer, 49152, [2])
    tools = [Tool.model_validate(WEATHER), Tool.model_validate(TIME)]

    def accepts(spec: StructuredOutput, text: str) -> bool:
        matcher = compiler.compile(spec)[0].new_matcher()
        ok = all(matcher.consume_token(t) for t in smollm2_tokenizer.encode(text, add_special_tokens=False))
        return ok and matcher.is_accepting()

    single = call_grammar(tools, "required", parallel=False)
    assert accepts(single, CALL)
    assert accepts(single, '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    assert not accepts(single, CALL.replace('"city": "Oslo"', '"town": "Oslo"'))
    assert not accepts(single, CALL + "\n" + CALL)
    assert accepts(call_grammar(tools, "required", parallel=True), CALL + "\n" + CALL)
    choice = request(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}})
    named = call_grammar(tools, choice.tool_choice, parallel=True)
    assert accepts(named, '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    assert not accepts(named, CALL)


def grammar_accepts(compiler, tokenizer, spec: StructuredOutput, text: str) -> bool:
    matcher = compiler.compile(spec)[0].new_matcher()
    ok = all(matcher.consume_token(t) for t in tokenizer.encode(text, add_special_tokens=False))
    return ok and matcher.is_accepting()


def test_auto_enforces_every_call_the_model_opens_and_parallel_false_allows_one(smollm2_tokenizer):
    from decoding.structured.compiler import GrammarCompiler

    compiler = GrammarCompiler(smollm2_tokenizer, 49152, [2])
    tools = [Tool.model_validate(WEATHER), Tool.model_validate(TIME)]

    def accepts(spec: StructuredOutput, text: str) -> bool:
        return grammar_accepts(compiler, smollm2_tokenizer, spec, text)

    auto = call_grammar(tools, "auto", parallel=True)
    assert accepts(auto, "It is sunny.") and accepts(auto, "Let me check. " + CALL + "\nDone.")
    assert accepts(auto, CALL + "\n" + CALL.replace("Oslo", "Rome"))
    assert not accepts(auto, CALL.replace("get_weather", "get_wether"))  # a name never offered
    assert not accepts(auto, CALL.replace('"city": "Oslo"', '"city": 3'))  # arguments off the schema
    assert not accepts(auto, "Sure. " + CALL[:40])  # an open call cannot end the reply
    single = call_grammar(tools, None, parallel=False)
    assert accepts(single, "Sure. " + CALL) and accepts(single, "no call")
    assert not accepts(single, CALL + "\n" + CALL) and not accepts(single, CALL + " and more text")
    loose = Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}})  # fmt: skip
    strict = Tool.model_validate({**loose.model_dump(), "function": {**loose.function.model_dump(), "strict": True}})
    extra = '<tool_call>\n{"name": "f", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert accepts(call_grammar([loose], "auto", True), extra)  # JSON Schema's default admits other properties
    assert not accepts(call_grammar([strict], "auto", True), extra)  # strict: only the named ones


def test_tools_with_a_json_answer_and_the_one_limit_required_can_meet():
    answer = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object", "properties": {
        "temp": {"type": "number"}}, "required": ["temp"]}}}  # fmt: skip
    combined = request(tools=[WEATHER], response_format=answer).params({}).structured_output
    assert combined.param == "tools" and "answer: %json" in combined.value
    with pytest.raises(ParameterError) as error:
        request(tools=[WEATHER], structured_outputs={"regex": "a+"}).params({})
    assert error.value.param == "structured_outputs"
    big = {"type": "object", "properties": {f"field_{k}": {"type": "string", "description": "x" * 40}
                                            for k in range(12)}}  # fmt: skip
    many = [{"type": "function", "function": {"name": f"tool_{i}", "parameters": big}} for i in range(100)]
    assert len(json.dumps(many)) > 64_000  # more than one user constraint may hold, fewer than the tools' limit
    required = request(tools=many, tool_choice="required").params({}).structured_output
    required.validate()  # no 400 blaming tool_choice for tools the request was allowed to send
    huge = [{"type": "function", "function": {"name": f"t{i}", "description": "y" * 3000}} for i in range(100)]
    with pytest.raises(ParameterError) as error:
        request(tools=huge).params({})
    assert error.value.param == "tools" and "256000" in error.value.message


def test_bad_template_or_parser_flags_stop_the_server_at_start(tmp_path):
    from server.config.settings import Settings, shipped_tool_template

    with pytest.raises(ValueError, match="tool-call-parser"):
        Settings(tool_call_parser="nope").check()
    with pytest.raises(ValueError, match="no such file"):
        Settings(chat_template=str(tmp_path / "absent.jinja")).check()
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for x in %}")
    with pytest.raises(ValueError, match="broken.jinja"):
        Settings(chat_template=str(broken)).check()
    assert shipped_tool_template().endswith("hermes_tools.jinja")
    assert Settings().engine_config().tool_chat_template == shipped_tool_template()
