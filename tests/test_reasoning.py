"""``--reasoning-parser``: the thinking split from the answer, streamed and whole, on chat and the
Responses API; constraints wrapped so they hold after the end-of-thinking tag, under every strategy."""

from __future__ import annotations

import json

import jsonschema
import pytest

from decoding import FinishReason, RequestOutput, SequenceDelta
from decoding.params import GenerationParams
from decoding.params.structured import StructuredOutput
from server.api.chat.format import ChatFormat
from server.api.messages.format import Reply
from server.api.responses.events import ResponseEvents
from server.api.responses.format import ResponseBuilder
from server.api.responses.items import template_messages
from server.api.responses.replay import recorded, replayed_events
from server.config.settings import Settings
from server.output.collect import Collected
from server.output.reasoning import END, FORMATS, START, check_reasoning_parser, reasoning_format, split_reasoning
from server.output.tool_parser import HermesStream
from server.translate.structured import answer_after_thinking, thinking_then
from server.translate.tools import Tool, call_grammar
from tests.structured_schemas import SCHEMAS
from tests.test_structured_engine import compiler, constrained, model, prompts, run, strategy_knobs  # noqa: F401

R1, QWEN3, THINK = FORMATS["deepseek_r1"], FORMATS["qwen3"], FORMATS["think"]

# (format, reply, thinking, answer)
WHOLE = [
    (R1, "let me see</think>\n\nThe answer.", "let me see", "The answer."),
    (R1, "<think>again</think>Yes", "again", "Yes"),  # a reply that repeats the prompt's opening tag
    (R1, "still thinking when cut", "still thinking when cut", ""),
    (R1, "</think>", None, ""),
    (QWEN3, "<think>\nhmm\n</think>\n\nHello", "\nhmm\n", "Hello"),
    (QWEN3, "\n<think>a</think>b", "a", "b"),
    (QWEN3, "Hello <think>not a block</think>", None, "Hello <think>not a block</think>"),
    (QWEN3, "<thin", None, "<thin"),
    (QWEN3, "<think>cut short", "cut short", ""),
    (QWEN3, "", None, ""),
    (THINK, "<think>a</think>\n<think>b</think>\n\nc <think>d</think>", "ab", "c <think>d</think>"),
    (THINK, "<think>a</think> <th", "a", "<th"),
    (THINK, "plain", None, "plain"),
    # once the answer has started, tags inside it are its text: the thinking never follows the answer
    (THINK, "a<think>b</think> c<think>d</think>e <th", None, "a<think>b</think> c<think>d</think>e <th"),
    (QWEN3, "<think>a</think> <think>b</think>", "a", "<think>b</think>"),
    (R1, 'a</think>{"k": "</think> <think>"}', "a", '{"k": "</think> <think>"}'),
    (QWEN3, '{"k": "<think>"}', None, '{"k": "<think>"}'),
]


@pytest.mark.parametrize(("fmt", "reply", "thinking", "answer"), WHOLE)
def test_a_whole_reply_splits_into_thinking_and_answer(fmt, reply, thinking, answer):
    assert split_reasoning(reply, fmt) == (thinking, answer)


@pytest.mark.parametrize(("fmt", "reply", "thinking", "answer"), WHOLE)
def test_every_way_of_cutting_a_reply_into_deltas_gives_the_same_split_and_no_tag(fmt, reply, thinking, answer):
    cuts = [[reply[:i], reply[i:j], reply[j:]] for i in range(len(reply) + 1) for j in range(i, len(reply) + 1)]
    cuts.append(list(reply))  # one character at a time
    for deltas in cuts:
        stream = fmt.stream()
        pieces = [stream.feed(delta) for delta in deltas] + [stream.finish()]
        assert "".join(t for t, _ in pieces) == (thinking or "")
        assert "".join(a for _, a in pieces) == answer
        if START not in answer and END not in answer:  # a tag never leaks into a piece
            assert not any(tag in t + a for t, a in pieces for tag in (START, END))


def test_the_setting_names_vllms_parsers_and_refuses_others():
    assert Settings().reasoning_parser == "none" and reasoning_format("none") is None
    for name in ("deepseek_r1", "qwen3", "think"):
        check_reasoning_parser(name)
        assert reasoning_format(name).name == name
        assert reasoning_format(name, thinking=False) is None  # thinking turned off: the reply is all answer
    with pytest.raises(ValueError, match="--reasoning-parser 'r1'.*deepseek_r1"):
        Settings(reasoning_parser="r1").check()


# ---- chat ------------------------------------------------------------------------------------------
REPLY = ["<thi", "nk>I should c", "all f.</th", 'ink>\n<tool_call>\n{"name": "f", "arguments": {}}', "\n</tool_call>"]


def deltas_of(pieces: list[str]) -> list[RequestOutput]:
    last = len(pieces) - 1
    return [RequestOutput("r", [SequenceDelta(0, text, [i], None, FinishReason.STOP if i == last else None)], 3, i + 1)
            for i, text in enumerate(pieces)]  # fmt: skip


def chat(pieces: list[str], **options) -> tuple[dict, list[dict]]:
    streamed, whole = ChatFormat("id", "m", 1, **options), ChatFormat("id", "m", 1, **options)
    collected = Collected()
    chunks = []
    for output in deltas_of(pieces):
        chunks += streamed.chunks(0, output)
        collected.add(output)
    return whole.body([collected]), [chunk["choices"][0]["delta"] for chunk in chunks]


def test_chat_gives_the_thinking_apart_and_the_tool_parser_reads_only_the_answer():
    body, deltas = chat(REPLY, reasoning=QWEN3, tool_parser=lambda: HermesStream(["f"]))
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == message["reasoning"] == "I should call f."
    assert message["content"] is None and message["tool_calls"][0]["function"]["name"] == "f"
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    thinking = [d for d in deltas if "reasoning_content" in d]
    assert "".join(d["reasoning_content"] for d in thinking) == "I should call f."
    assert all(d["reasoning"] == d["reasoning_content"] for d in thinking)
    first_call = next(i for i, d in enumerate(deltas) if "tool_calls" in d)
    assert deltas.index(thinking[-1]) < first_call  # the thinking streams before the answer
    assert not any(d.get("content") for d in deltas)


def test_a_call_inside_the_thinking_is_thinking_not_a_call():
    pieces = ['<think><tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', "</think>Fine."]
    body, deltas = chat(pieces, reasoning=QWEN3, tool_parser=lambda: HermesStream(["f"]))
    message = body["choices"][0]["message"]
    assert "tool_calls" not in message and message["content"] == "Fine."
    assert message["reasoning_content"].startswith("<tool_call>")
    assert "".join(d.get("content") or "" for d in deltas) == "Fine."


def test_chat_without_a_parser_is_unchanged_and_a_reply_without_thinking_has_null_reasoning():
    body, _ = chat(["<think>x</think>y"])
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "<think>x</think>y", "refusal": None}
    body, deltas = chat(["Just ", "an answer"], reasoning=QWEN3)
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] is None and message["reasoning"] is None
    assert message["content"] == "Just an answer"
    assert "".join(d.get("content") or "" for d in deltas) == "Just an answer"


def test_streamed_token_ids_cover_every_token_once_with_thinking():
    body, deltas = chat(["<think>a", "b</think>", "c"], reasoning=QWEN3, return_token_ids=True)
    assert [i for d in deltas for i in d.get("token_ids", [])] == body["choices"][0]["token_ids"] == [0, 1, 2]


# ---- Responses API ---------------------------------------------------------------------------------
def responses(pieces: list[str], **options) -> tuple[dict, list[dict], dict]:
    builder = ResponseBuilder("resp_1", "m", {}, reasoning=R1, **options)
    events = ResponseEvents(builder)
    collected = Collected()
    sent = events.start()
    for output in deltas_of(pieces):
        sent += events.feed(output)
        collected.add(output)
    closing, final = events.finish()
    sent += closing + [events.final_event(final)]
    return builder.body(collected), [json.loads(e["data"]) for e in sent], recorded(final, events, True)


def test_responses_output_a_reasoning_item_before_the_message_streamed_and_not():
    body, events, _ = responses(["Let me ", "think.</th", "ink>\n\nIt is ", "42."])
    reasoning, message = body["output"]
    assert reasoning["type"] == "reasoning" and reasoning["summary"] == [] and reasoning["status"] == "completed"
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Let me think."}]
    assert reasoning["id"].startswith("rs_") and message["content"][0]["text"] == "It is 42."
    kinds = [e["type"] for e in events]
    assert kinds[2:9] == ["response.output_item.added", "response.content_part.added",
                          "response.reasoning_text.delta", "response.reasoning_text.delta",
                          "response.reasoning_text.done", "response.content_part.done",
                          "response.output_item.done"]  # fmt: skip
    deltas = [e["delta"] for e in events if e["type"] == "response.reasoning_text.delta"]
    assert "".join(deltas) == "Let me think."
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "It is 42." and all(e["output_index"] == 1 for e in events if "output_text" in e["type"])
    final = events[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["reasoning", "message"]
    assert final["output"][0]["content"] == reasoning["content"]


def test_a_reply_cut_short_while_thinking_has_an_incomplete_reasoning_item_and_no_empty_message():
    builder = ResponseBuilder("resp_1", "m", {}, reasoning=R1)
    events = ResponseEvents(builder)
    out = RequestOutput("r", [SequenceDelta(0, "still thinking", [1, 2], None, FinishReason.LENGTH)], 3, 2,
                        finished=True)  # fmt: skip
    closing = events.feed(out)
    more, final = events.finish()
    closing += more
    collected = Collected()
    collected.add(out)
    body = builder.body(collected)
    for response in (final, body):
        assert response["status"] == "incomplete"
        assert [(i["type"], i["status"]) for i in response["output"]] == [("reasoning", "incomplete")]
        assert response["usage"]["output_tokens_details"] == {"reasoning_tokens": 2}
    assert not any("output_text" in e["event"] or "message" in e["data"] for e in closing)


def test_a_replayed_stream_has_the_same_reasoning_events():
    _, events, stored = responses(["ab", "c</think>", "d"])
    replayed = [json.loads(e["data"]) for e in replayed_events(stored)]
    live = [e for e in events if e["type"] not in ("response.created", "response.in_progress")]
    again = [e for e in replayed if e["type"] not in ("response.created", "response.queued", "response.in_progress")]
    strip = lambda e: {k: v for k, v in e.items() if k not in ("sequence_number", "response")}  # noqa: E731
    assert [strip(e) for e in again] == [strip(e) for e in live]


def test_a_stored_reasoning_item_is_not_rendered_in_a_continued_conversation():
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
             {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "yo"}]}]  # fmt: skip
    assert template_messages(None, items) == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]


def test_a_replayed_reasoning_input_item_is_kept_and_not_rendered():
    """Clients that send the history back (the agents SDK without previous_response_id) replay the
    reasoning items they got: accepted, stored as items, left out of the prompt."""
    from server.api.responses.protocol import ResponsesRequest

    body = ResponsesRequest.model_validate({"model": "m", "input": [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}],
         "encrypted_content": None},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "yo"}]},
        {"type": "message", "role": "user", "content": "and?"}]})  # fmt: skip
    items = body.input_items()
    assert [item["type"] for item in items] == ["message", "reasoning", "message", "message"]
    assert items[1]["id"] == "rs_1" and items[1]["content"] == [{"type": "reasoning_text", "text": "t"}]
    assert [m["content"] for m in template_messages(None, items)] == ["hi", "yo", "and?"]


# ---- Messages API -----------------------------------------------------------------------------------
def test_messages_give_a_thinking_block_first_and_the_same_blocks_streamed_and_whole():
    streamed, whole = (Reply("msg_1", "m", lambda: HermesStream(["f"]), QWEN3) for _ in range(2))
    events = [e for output in deltas_of(REPLY) for e in streamed.feed(output)]
    for output in deltas_of(REPLY):
        whole.feed(output)
    thinking, call = whole.message()["content"]
    assert thinking == {"type": "thinking", "thinking": "I should call f.", "signature": ""}
    assert call["type"] == "tool_use" and call["name"] == "f" and whole.stop() == ("tool_use", None)
    no_ids = lambda reply: [{k: v for k, v in b.items() if k != "id"} for b in reply.message()["content"]]  # noqa: E731
    assert no_ids(streamed) == no_ids(whole)
    kinds = [(e["type"], e["index"], e.get("delta", {}).get("type")) for e in events]
    assert kinds[0] == ("content_block_start", 0, None) and events[0]["content_block"]["type"] == "thinking"
    assert "".join(e["delta"]["thinking"] for e in events if e.get("delta", {}).get("type") == "thinking_delta") == (
        "I should call f.")  # fmt: skip
    assert kinds.index(("content_block_stop", 0, None)) < kinds.index(("content_block_start", 1, None))


# ---- constraints on the answer only ----------------------------------------------------------------
def accepts(compiler, spec: StructuredOutput, tokenizer, text: str) -> bool:  # noqa: F811
    matcher = compiler.compile(spec)[0].new_matcher()
    return all(matcher.consume_token(t) for t in tokenizer.encode(text, add_special_tokens=False)) and (
        matcher.is_accepting()
    )


def test_every_kind_of_constraint_holds_after_the_thinking_only(compiler, smollm2_tokenizer):  # noqa: F811
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    tool = Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": schema}})
    cases = [
        (StructuredOutput("json", schema, "response_format"), '{"n": 3}', '{"n": "x"}'),
        (StructuredOutput("regex", r"[0-9]{3}/[a-z]+", "structured_outputs"), "123/ab", "12/ab"),
        (StructuredOutput("choice", ["yes", "no"], "structured_outputs"), "no", "maybe"),
        (StructuredOutput("grammar", 'root ::= "A" "B"*', "structured_outputs"), "ABB", "BA"),  # GBNF
        (StructuredOutput("grammar", 'start: "x" "}"', "structured_outputs"), "x}", "x"),
        (call_grammar([tool], "required", True), '<tool_call>\n{"name": "f", "arguments": {"n": 1}}\n</tool_call>',
         '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'),
    ]  # fmt: skip
    thinking = 'I may write {"n": "x"} or <tool_call> here, freely.'
    for spec, good, bad in cases:
        r1, qwen3 = thinking_then(spec, R1), thinking_then(spec, QWEN3)
        assert r1.param == spec.param and r1.kind == "grammar"
        assert accepts(compiler, r1, smollm2_tokenizer, f"{thinking}</think>{good}"), spec
        assert not accepts(compiler, r1, smollm2_tokenizer, f"{thinking}</think>{bad}"), spec
        assert not accepts(compiler, r1, smollm2_tokenizer, good)  # deepseek_r1: the thinking must end first
        assert accepts(compiler, qwen3, smollm2_tokenizer, f"<think>{thinking}</think>{good}"), spec
        assert accepts(compiler, qwen3, smollm2_tokenizer, good), spec  # qwen3: the block is optional
        assert not accepts(compiler, qwen3, smollm2_tokenizer, f"<think>{thinking}</think>{bad}"), spec


def test_params_are_wrapped_only_with_a_parser_and_a_bad_grammar_names_its_field():
    spec = StructuredOutput("json", {"type": "object"}, "response_format")
    params = GenerationParams(structured_output=spec)
    assert answer_after_thinking(params, None) is params
    assert answer_after_thinking(GenerationParams(), R1).structured_output is None
    assert answer_after_thinking(params, R1).structured_output == thinking_then(spec, R1)
    from decoding import ParameterError

    with pytest.raises(ParameterError) as error:
        thinking_then(StructuredOutput("grammar", "root ::= (", "structured_outputs"), R1)
    assert error.value.param == "structured_outputs"


# the tiny random model rarely ends its thinking by itself: "</think>" (SmolLM2's "</", "think", ">") is
# made likely once its first token is there ("</think" can then only be closed), that first token
# only a little (per strategy: enough to end the thinking, not so much that it is always empty);
# everything after the tag is the grammar's doing. Beam search ranks by the model's scores before
# the mask (HF's): a random model's beams think on rather than pay for the answer's forced tokens,
# unless the scores are renormalized after the mask (HF's renormalize_logits), as here.
END_IDS = (9617, 17400, 46)
END_BIAS = [[list(END_IDS[: k + 1]), 40.0] for k in range(1, len(END_IDS))]
END_BIAS += [[[9617, 9617], -100.0], [[9617, 17400, 9617], -100.0], [[9617, 17400, 17400], -100.0]]
FIRST_BIAS = {"greedy": 1.0, "sampling": 2.0, "beam": 2.0, "contrastive": 0.5}


@pytest.mark.parametrize("name", ["greedy", "sampling", "beam", "contrastive"])
def test_the_answer_validates_after_free_thinking_under_every_strategy(model, smollm2_tokenizer, compiler, name):  # noqa: F811
    requests, schemas = {}, {}
    for i, schema in enumerate(SCHEMAS[:12]):
        spec = thinking_then(StructuredOutput("json", schema, "response_format"), R1)
        knobs = {**strategy_knobs(name), **({"seed": 40 + i} if name == "sampling" else {})}
        if name == "beam":
            knobs["renormalize_logits"] = True
        bias = [[[END_IDS[0]], FIRST_BIAS[name]], *END_BIAS]
        params = constrained(compiler, spec, max_new_tokens=200, sequence_bias=bias, **knobs)
        requests[str(i)], schemas[str(i)] = (prompts(1, seed=70 + i)[0], params), schema
    harness = run(model, smollm2_tokenizer, requests, max_num_seqs=128, max_model_len=320)
    answered = thought = 0
    for key, schema in schemas.items():
        text = harness.text(key)
        if END not in text:  # still thinking when the budget ran out: free text, cut by length
            assert harness.finish_reason(key) == "length"
            continue
        thinking, answer = split_reasoning(text, R1)
        assert harness.finish_reason(key) == "stop", f"{name} {key}: {text!r}"
        jsonschema.validate(json.loads(answer), schema)
        answered += 1
        thought += thinking is not None
    assert answered >= len(schemas) // 2, f"{name}: only {answered} replies ended their thinking"
    assert thought or name == "beam"  # free text before the tag, which the answer's grammar would refuse


# ---- the answer first: the thinking never follows it (issue 50) ---------------------------------------
def test_tags_after_the_answer_started_are_its_text_on_every_api():
    """``think`` once read any later block as thinking: Messages sent a thinking delta to the text block's
    index and never stopped it, the Responses API gave two items one output_index."""
    pieces = ["Hi <thi", "nk>x</think> there"]
    body, deltas = chat(pieces, reasoning=THINK)
    assert body["choices"][0]["message"]["content"] == "Hi <think>x</think> there"
    assert not any(d.get("reasoning_content") for d in deltas)
    reply = Reply("msg_1", "m", None, THINK)
    events = [e for output in deltas_of(pieces) for e in reply.feed(output)]
    kinds = [(e["type"], e["index"]) for e in events]
    assert kinds == [("content_block_start", 0), ("content_block_delta", 0), ("content_block_delta", 0),
                     ("content_block_stop", 0)]  # fmt: skip
    assert reply.message()["content"] == [{"type": "text", "text": "Hi <think>x</think> there"}]
    builder = ResponseBuilder("resp_1", "m", {}, reasoning=THINK)
    stream = ResponseEvents(builder)
    sent = [json.loads(e["data"]) for output in deltas_of(pieces) for e in stream.feed(output)]
    sent += [json.loads(e["data"]) for e in stream.finish()[0]]
    assert {e["output_index"] for e in sent} == {0} and [i["type"] for i in stream.output] == ["message"]


def test_usage_counts_the_thinking_tokens_on_chat_and_responses():
    """Each delta's tokens where its text went: the tags and the separator are the thinking's."""
    pieces = ["<think>a", "b</think>", "\n", "c"]  # one token each: three thought, one answered
    streamed, whole = (ChatFormat("id", "m", 1, reasoning=QWEN3, include_usage=True) for _ in range(2))
    collected = Collected()
    for output in deltas_of(pieces):
        streamed.chunks(0, output)
        collected.add(output)
    details = {"reasoning_tokens": 3, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
    assert whole.body([collected])["usage"]["completion_tokens_details"] == details
    assert streamed.usage_chunk()["usage"]["completion_tokens_details"] == details
    plain = ChatFormat("id", "m", 1).body([collected])["usage"]  # no parser: nothing is thinking
    assert plain["completion_tokens_details"]["reasoning_tokens"] == 0
    body, events, _ = responses(["Let me ", "think.</th", "ink>\n\nIt is ", "42."])  # deepseek_r1
    assert body["usage"]["output_tokens_details"] == events[-1]["response"]["usage"]["output_tokens_details"] == {
        "reasoning_tokens": 2}  # fmt: skip
