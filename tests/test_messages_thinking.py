"""Anthropic's ``thinking`` on ``/v1/messages`` against the in-process fake engine: ``enabled`` with a budget
reaches the engine as the parser's end tag to force (a 400 naming ``thinking`` without a parser, and
Anthropic's own budget rules), ``disabled`` reaches the template as ``enable_thinking: false`` and
splits nothing, ``display: "omitted"`` leaves the thinking's text out, and the thinking blocks a client
sends back (every tool loop's second turn) are accepted and not rendered."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from decoding import FinishReason, GenerationParams, RequestOutput, SequenceDelta
from decoding.params.model_checks import ModelFacts
from tests.fake_engine import WORDS, FakeEngineClient
from tests.test_api import MODEL
from tests.test_messages_api import COUNT, HELLO, MESSAGES, WEATHER, anthropic_error, call, events

R1 = {"reasoning_parser": "deepseek_r1"}
BUDGET = {"type": "enabled", "budget_tokens": 1024}
REPLY = ["I think", " a while.</think>", "\n\nThe answer."]


class ThinkingEngine(FakeEngineClient):
    """Replies ``REPLY`` (one delta per piece, one token each) and keeps what the template got."""

    facts = ModelFacts(vocab_size=len(WORDS), max_model_len=4096, num_layers=4)  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.rendered: list[tuple[list[dict], dict | None]] = []

    async def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None,
                                  template_kwargs: dict | None = None) -> list[int]:  # fmt: skip
        self.rendered.append((messages, template_kwargs))
        return await super().apply_chat_template(messages, tools, template_kwargs)

    async def compile_structured_output(self, params: GenerationParams) -> GenerationParams:
        return params  # any constraint (a tool call's grammar) is accepted

    def generate(self, request_id: str, prompt_ids: list[int], params: GenerationParams) -> AsyncIterator:
        self.submitted.append((request_id, prompt_ids, params))
        return self._scripted(request_id, prompt_ids)

    async def _scripted(self, request_id: str, prompt_ids: list[int]) -> AsyncIterator[RequestOutput]:
        for i, piece in enumerate(REPLY):
            last = i == len(REPLY) - 1
            delta = SequenceDelta(0, piece, [i + 1], None, FinishReason.STOP if last else None)
            yield RequestOutput(request_id, [delta], len(prompt_ids), i + 1, finished=last)


def send(engine: FakeEngineClient, settings: dict, **body: object):  # noqa: ANN201
    return call(engine, MESSAGES, {"model": MODEL, "max_tokens": 2000, "messages": HELLO, **body}, **settings)


def test_enabled_thinking_reaches_the_engine_as_a_budget_and_the_end_tag():
    engine = ThinkingEngine()
    response = send(engine, R1, thinking=BUDGET)
    assert response.status_code == 200, response.text
    params = engine.submitted[0][2]
    assert params.thinking_budget == 1024 and params.thinking_end_ids == engine._words("</think>")
    assert params.thinking_start_ids is None  # deepseek_r1: the prompt opened the thinking
    assert [b["type"] for b in response.json()["content"]] == ["thinking", "text"]
    qwen3 = ThinkingEngine()
    assert send(qwen3, {"reasoning_parser": "qwen3"}, thinking=BUDGET).status_code == 200
    assert qwen3.submitted[0][2].thinking_start_ids == qwen3._words("<think>")  # the reply opens its own
    plain = ThinkingEngine()
    assert send(plain, R1).status_code == 200 and plain.submitted[0][2].thinking_budget is None


@pytest.mark.parametrize(("settings", "thinking", "max_tokens", "named"), [
    ({}, BUDGET, 2000, "--reasoning-parser"),  # no parser: nothing could honour the budget
    (R1, {"type": "enabled", "budget_tokens": 1023}, 2000, "at least 1024"),
    (R1, BUDGET, 1024, "max_tokens (1024) must be greater than thinking.budget_tokens"),
    (R1, {"type": "between_tools"}, 2000, "between_tools"),
    (R1, {"type": "enabled"}, 2000, "budget_tokens"),
    (R1, {"type": "enabled", "budget_tokens": 2000, "display": "full"}, 4000, "display"),
])  # fmt: skip
def test_thinking_the_server_cannot_honour_is_a_400_naming_it(settings, thinking, max_tokens, named):
    response = send(ThinkingEngine(), settings, thinking=thinking, max_tokens=max_tokens)
    message = anthropic_error(response, 400, "invalid_request_error")
    assert named in message and "thinking" in message


def test_disabled_thinking_turns_the_templates_thinking_off_and_splits_nothing():
    engine = ThinkingEngine()
    body = send(engine, R1, thinking={"type": "disabled"}).json()
    assert engine.rendered[0][1] == {"enable_thinking": False}
    assert body["content"] == [{"type": "text", "text": "".join(REPLY)}]  # the whole reply is the answer
    counted = call(engine, COUNT, {"messages": HELLO, "thinking": {"type": "disabled"}}, **R1)
    assert counted.status_code == 200 and engine.rendered[-1][1] == {"enable_thinking": False}
    send(engine, R1)
    assert engine.rendered[-1][1] is None  # left out: the template's own default


def test_adaptive_thinking_is_the_models_own_and_omitted_display_leaves_the_text_out():
    adaptive = send(ThinkingEngine(), R1, thinking={"type": "adaptive"}).json()["content"]
    assert adaptive[0] == {"type": "thinking", "thinking": "I think a while.", "signature": ""}
    assert send(ThinkingEngine(), {}, thinking={"type": "adaptive"}).status_code == 200  # no parser: no thinking
    omitted = {"type": "enabled", "budget_tokens": 1024, "display": "omitted"}
    whole = send(ThinkingEngine(), R1, thinking=omitted).json()["content"]
    assert whole == [{"type": "thinking", "thinking": "", "signature": ""}, {"type": "text", "text": "The answer."}]
    sent = events(send(ThinkingEngine(), R1, thinking=omitted, stream=True).text)
    assert not any(p.get("delta", {}).get("type") == "thinking_delta" for _, p in sent)
    starts = [p["content_block"] for n, p in sent if n == "content_block_start"]
    assert starts[0] == {"type": "thinking", "thinking": "", "signature": ""}


def test_thinking_blocks_sent_back_are_accepted_and_not_rendered():
    """Turn 2 of a tool loop: the assistant turn as the SDK returned it (thinking, tool_use), then the result."""
    engine = ThinkingEngine()
    conversation = HELLO + [
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should look it up.", "signature": ""},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3 C"}]},
    ]  # fmt: skip
    response = send(engine, R1, messages=conversation, tools=[WEATHER])
    assert response.status_code == 200, response.text
    rendered = engine.rendered[0][0]
    call_ = {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    assert rendered[1] == {"role": "assistant", "content": "", "tool_calls": [call_]}
    assert "I should look it up." not in str(rendered) and "opaque" not in str(rendered)
    counted = call(engine, COUNT, {"messages": conversation, "tools": [WEATHER]}, **R1)
    assert counted.status_code == 200
    assert send(ThinkingEngine(), {}, messages=conversation, tools=[WEATHER]).status_code == 200  # any server


@pytest.mark.parametrize("block", [{"type": "thinking", "thinking": "x", "signature": ""},
                                   {"type": "redacted_thinking", "data": "x"}])  # fmt: skip
def test_thinking_blocks_belong_to_assistant_turns(block):
    user = [{"role": "user", "content": [block]}]
    assert "messages[0].content[0]" in anthropic_error(send(ThinkingEngine(), R1, messages=user), 400,
                                                       "invalid_request_error")  # fmt: skip
    result = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [block]}]}]
    assert "text blocks" in anthropic_error(send(ThinkingEngine(), R1, messages=result), 400, "invalid_request_error")
