"""A property test of the reasoning split through every API's stream formatter (``--reasoning-parser``).

A seeded generator writes replies of every shape a model may write: thinking then an answer, an answer
that holds tags (a JSON string, prose, a tool call's arguments), an answer and then a "thinking"
block, several blocks, none; cuts them at random points into deltas (a tag split anywhere, deltas of
zero to three tokens, some with no text) and sometimes cuts the reply short (mid-tag, mid-thinking:
finish ``length``). Each goes through chat's, the Responses API's and the Messages API's stream
formatters and whole-body builders, with and without a tool-call parser, and each stream is checked
against its API's spec: chat's ``reasoning_content`` before any answer; the Responses API's items each
with its own ``output_index``, added/done pairs, content parts opened and closed, consecutive
sequence numbers, the replay of a stored response event for event; the Messages API's blocks started
and stopped in turn with growing indexes, each delta to the open block of its kind. The concatenated
deltas equal the whole body, the usage's reasoning tokens agree, an uncut reply splits as written
(once the answer started, a tag in it is text), and no message or text block is ever empty."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import pytest

from decoding import FinishReason, RequestOutput, SequenceDelta
from server.api.chat.format import ChatFormat
from server.api.messages.format import Reply
from server.api.responses.events import ResponseEvents
from server.api.responses.format import ResponseBuilder
from server.api.responses.replay import recorded, replayed_events
from server.output.collect import Collected
from server.output.reasoning import END, FORMATS, START, split_reply
from server.output.tool_parser import HermesStream

CASES = 150
WORDS = ["so", "x", "<", ">", "</", "<th", "think", "/", "{", "}", '"', "\n", " ", "é", "</th", "<thi"]
ANSWERS = [
    "The answer.",
    '{"k": "</think> and <think>", "n": 1}',  # a grammar-guaranteed JSON answer holding both tags
    "Use <think> tags: <think>like this</think>.",
    'Done <tool_call>\n{"name": "f", "arguments": {"s": "<think>x</think>"}}\n</tool_call>',
    '<tool_call>\n{"name": "f", "arguments": {"s": "</think>"}}\n</tool_call>',
    "a\n<think>late thinking is answer</think> b",
]


@dataclass
class Reply_:
    fmt_name: str
    text: str
    thinking: str | None  # as written: None when it did not think (for an uncut reply)
    answer: str


def words(rng: random.Random, low: int = 1, high: int = 8) -> str:
    text = "".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))
    return text if END not in text else words(rng, low, high)


def written(rng: random.Random, fmt_name: str) -> Reply_:
    """A reply and its split as the format defines it (see server.output.reasoning)."""
    answer = rng.choice(ANSWERS)
    gap = rng.choice(["", "\n", "\n\n", " \n"])
    if fmt_name == "deepseek_r1":
        thought = words(rng)
        if rng.random() < 0.15:  # never closed: all thinking
            return Reply_(fmt_name, thought, thought, "")
        opened = START if rng.random() < 0.2 else ""
        if not opened and thought.startswith(START):  # that would be the opening tag repeated
            thought = "so" + thought
        return Reply_(fmt_name, f"{opened}{thought}{END}{gap}{answer}", thought, answer)
    shape = rng.choice(["thinks", "answers", "answers_then_tags"] + (["blocks"] if fmt_name == "think" else []))
    lead = rng.choice(["", "\n", " "])
    if shape == "answers":
        return Reply_(fmt_name, lead + answer, None, lead + answer)
    if shape == "answers_then_tags":  # the old text search put this second part into the thinking
        text = f"{lead}{answer} {START}{words(rng)}{END} more"
        return Reply_(fmt_name, text, None, text)
    count = 1 if shape == "thinks" else rng.randint(2, 3)
    thoughts = [words(rng) for _ in range(count)]
    blocks = rng.choice(["", "\n"]).join(f"{START}{t}{END}" for t in thoughts)
    return Reply_(fmt_name, f"{lead}{blocks}{gap}{answer}", "".join(thoughts), answer)


def outputs(rng: random.Random, text: str) -> tuple[list[RequestOutput], bool]:
    """The reply as engine outputs: cut at random points, sometimes cut short (finish ``length``)."""
    cut = rng.random() < 0.3
    if cut:
        text = text[: rng.randint(0, len(text))]
    points = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 12)))) if len(text) > 1 else []
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    for _ in range(rng.randint(0, 2)):  # text the detokenizer holds back: tokens, no text yet
        pieces.insert(rng.randint(0, len(pieces)), "")
    made, generated = [], 0
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        tokens = list(range(generated, generated + rng.randint(0 if piece else 1, 3)))
        generated += len(tokens)
        finish = (FinishReason.LENGTH if cut else FinishReason.STOP) if last else None
        made.append(RequestOutput("r", [SequenceDelta(0, piece, tokens, None, finish)], 5, generated, finished=last))
    return made, cut


def parser_of(with_tools: bool):  # noqa: ANN201
    return (lambda: HermesStream(["f"])) if with_tools else None


def cases() -> list[tuple[int, str, bool]]:
    return [(seed, name, tools) for seed in range(CASES) for name in FORMATS for tools in (False, True)]


# ---- chat ---------------------------------------------------------------------------------------------
def check_chat(fmt, outs: list[RequestOutput], tools: bool) -> dict:
    streamed = ChatFormat("id", "m", 1, reasoning=fmt, tool_parser=parser_of(tools), include_usage=True)
    whole = ChatFormat("id", "m", 1, reasoning=fmt, tool_parser=parser_of(tools))
    collected = Collected()
    deltas = []
    for out in outs:
        deltas += [c["choices"][0]["delta"] for c in streamed.chunks(0, out)]
        collected.add(out)
    body = whole.body([collected])
    message = body["choices"][0]["message"]
    thinking = "".join(d.get("reasoning_content") or "" for d in deltas)
    assert thinking == (message["reasoning_content"] or "")
    assert all(d.get("reasoning") == d.get("reasoning_content") for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    if message.get("tool_calls"):  # beside calls a body's content is trimmed (tool_formats.parse_whole)
        content = content.strip()
    assert content == (message["content"] or "")
    calls = [p for d in deltas for p in d.get("tool_calls") or []]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls if "id" in c] == [
        (c["function"]["name"], "") for c in message.get("tool_calls", [])]  # fmt: skip
    assert [c["function"]["arguments"] for c in calls if "id" not in c] == [
        c["function"]["arguments"] for c in message.get("tool_calls", [])]  # fmt: skip
    answered = [i for i, d in enumerate(deltas) if d.get("content") or d.get("tool_calls")]
    thought = [i for i, d in enumerate(deltas) if d.get("reasoning_content")]
    assert not (answered and thought) or max(thought) < min(answered)  # the thinking never follows the answer
    usage = streamed.usage_chunk()["usage"]
    assert usage["completion_tokens_details"] == body["usage"]["completion_tokens_details"]
    assert usage["completion_tokens"] == body["usage"]["completion_tokens"]
    return body


def summary(items: list[dict]) -> tuple[list[dict], list[dict], str]:
    """(reasoning items, function calls, the messages' text) without ids. Beside calls the text is
    trimmed (a body trims it: parse_whole) and may be one message or several (a stream's text after a
    call in the same delta is its own message; the body's content is one)."""
    plain = [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]
    calls = [item for item in plain if item["type"] == "function_call"]
    text = "".join(part["text"] for item in plain if item["type"] == "message" for part in item["content"])
    return [item for item in plain if item["type"] == "reasoning"], calls, text.strip() if calls else text


# ---- Responses ------------------------------------------------------------------------------------------
def check_responses(fmt, outs: list[RequestOutput], tools: bool) -> dict:
    builder = ResponseBuilder("resp_1", "m", {}, tool_parser=parser_of(tools), reasoning=fmt)
    events = ResponseEvents(builder)
    collected = Collected()
    sent = events.start()
    for out in outs:
        sent += events.feed(out)
        collected.add(out)
    closing, final = events.finish()
    sent += closing + [events.final_event(final)]
    payloads = [json.loads(e["data"]) for e in sent]
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    assert all(e["event"] == p["type"] for e, p in zip(sent, payloads, strict=True))
    check_items(payloads, final)
    body = builder.body(collected)
    assert summary(final["output"]) == summary(body["output"])
    assert final["usage"] == body["usage"] and final["status"] == body["status"]
    assert not any(i["type"] == "message" and not i["content"][0]["text"] for i in body["output"])
    replayed = [json.loads(e["data"]) for e in replayed_events(recorded(final, events, True))]
    strip = lambda e: {k: v for k, v in e.items() if k not in ("sequence_number", "response")}  # noqa: E731
    live = [strip(e) for e in payloads if e["type"] not in ("response.created", "response.in_progress")]
    again = [strip(e) for e in replayed if e["type"] not in ("response.created", "response.queued",
                                                              "response.in_progress")]  # fmt: skip
    assert again == live
    return body


def check_items(payloads: list[dict], final: dict) -> None:
    """Each item its own output_index, in order; added/done and part added/done pairs; deltas to the open one."""
    open_item: dict | None = None
    open_part = False
    done: list[dict] = []
    text = ""
    for p in payloads:
        kind = p["type"]
        if kind == "response.output_item.added":
            assert open_item is None and p["output_index"] == len(done)
            open_item, text = p["item"], ""
        elif kind == "response.output_item.done":
            assert open_item is not None and p["output_index"] == len(done) and p["item"]["id"] == open_item["id"]
            assert not open_part
            done.append(p["item"])
            open_item = None
        elif kind == "response.content_part.added":
            assert open_item is not None and not open_part and p["item_id"] == open_item["id"]
            open_part = True
        elif kind == "response.content_part.done":
            assert open_part and p["item_id"] == open_item["id"] and p["part"]["text"] == text
            open_part = False
        elif kind.endswith(".delta"):
            assert open_item is not None and p["output_index"] == len(done) and p["item_id"] == open_item["id"]
            wanted = {"reasoning": "response.reasoning_text.delta", "message": "response.output_text.delta",
                      "function_call": "response.function_call_arguments.delta"}[open_item["type"]]  # fmt: skip
            assert kind == wanted
            text += p["delta"]
        elif kind in ("response.reasoning_text.done", "response.output_text.done"):
            assert p["text"] == text and p["output_index"] == len(done)
    assert open_item is None and done == final["output"]


# ---- Messages -------------------------------------------------------------------------------------------
def check_messages(fmt, outs: list[RequestOutput], tools: bool) -> dict:
    streamed, whole = (Reply("msg_1", "m", parser_of(tools), fmt) for _ in range(2))
    sent = [e for out in outs for e in streamed.feed(out)]
    for out in outs:
        whole.feed(out)
    blocks: list[dict] = []
    open_index: int | None = None
    for e in sent:
        if e["type"] == "content_block_start":
            assert open_index is None and e["index"] == len(blocks)
            open_index = e["index"]
            blocks.append(json.loads(json.dumps(e["content_block"])))
        elif e["type"] == "content_block_delta":
            assert e["index"] == open_index
            block, delta = blocks[open_index], e["delta"]
            kind = {"thinking": "thinking_delta", "text": "text_delta", "tool_use": "input_json_delta"}[block["type"]]
            assert delta["type"] == kind
            if kind == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif kind == "text_delta":
                block["text"] += delta["text"]
            else:
                block["input"] = json.loads(delta["partial_json"])
        else:
            assert e["type"] == "content_block_stop" and e["index"] == open_index
            open_index = None
    assert open_index is None  # every block started is stopped
    no_ids = lambda content: [{k: v for k, v in b.items() if k != "id"} for b in content]  # noqa: E731
    message = whole.message()
    assert no_ids(blocks) == no_ids(message["content"]) == no_ids(streamed.message()["content"])
    assert not any(b["type"] == "text" and not b["text"] for b in message["content"])
    kinds = [b["type"] for b in message["content"]]
    assert "thinking" not in kinds[1:]  # the thinking block first, or none
    return message


@pytest.mark.parametrize(("seed", "name", "tools"), cases())
def test_every_api_streams_a_random_reply_by_its_spec(seed, name, tools):
    rng = random.Random(f"{seed}-{name}")
    fmt = FORMATS[name]
    reply = written(rng, name)
    outs, cut = outputs(rng, reply.text)
    text = "".join(o.deltas[0].text for o in outs)
    split = split_reply(text, fmt, [(len(o.deltas[0].text), len(o.deltas[0].token_ids)) for o in outs])
    if not cut:  # written as the format defines it: split exactly so, whatever the tags in the answer
        assert (split.thinking, split.answer) == (reply.thinking or None, reply.answer), reply.text
    if not fmt.opened_by_prompt and not text.lstrip().startswith(START):  # it never thought: no reasoning tokens
        assert split.thinking is None and split.reasoning_tokens == 0
    chat_body = check_chat(fmt, outs, tools)
    assert chat_body["usage"]["completion_tokens_details"]["reasoning_tokens"] == split.reasoning_tokens
    assert chat_body["choices"][0]["message"]["reasoning_content"] == split.thinking
    responses_body = check_responses(fmt, outs, tools)
    assert responses_body["usage"]["output_tokens_details"]["reasoning_tokens"] == split.reasoning_tokens
    message = check_messages(fmt, outs, tools)
    if split.thinking is not None:
        assert message["content"][0] == {"type": "thinking", "thinking": split.thinking, "signature": ""}
    if tools and not cut and "<tool_call>" in reply.answer:  # a call whose arguments hold a tag is kept whole
        (call,) = [b for b in message["content"] if b["type"] == "tool_use"]
        assert START in call["input"]["s"] or END in call["input"]["s"]
