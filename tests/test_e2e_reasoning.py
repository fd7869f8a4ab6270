"""``--reasoning-parser deepseek_r1`` end to end: the real ``openai`` client against a real server whose
chat template opens ``<think>`` in the generation prompt (as DeepSeek-R1's does), so the embedded
SmolLM2's reply starts inside its thinking. The small model never closes it by itself, so
``sequence_bias`` makes it write ``</think>`` after its first sentence (" French." in its greedy
reply) and ``min_tokens`` keeps it from stopping there: the reply then holds a thinking block and an
answer, which must split exactly (the reply's own text, from its token ids), streamed and not, on
chat, the Responses API and the Messages API (the ``anthropic`` SDK); a json_schema constrains the
answer only. Issue 50: Anthropic's ``thinking`` (a budget cut by forcing ``</think>``, ``disabled``, thinking
blocks sent back in a tool loop's second turn) and the reasoning tokens counted in every API's usage.
The 1024-token budget (Anthropic's minimum) is spent on a server of its own: a tiny Llama with SmolLM2's
tokenizer and this template, built to write " the" after any text, thinks 1024 tokens in seconds where
SmolLM2 takes minutes."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.test_e2e_openai import MODEL, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TEMPLATE = """{%- for message in messages %}<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is not defined or enable_thinking %}<think>
{% endif %}{% endif %}"""
# SmolLM2's " French", "." then "</", "think", ">"
END_BIAS = [[[3432, 30, 9617], 10.0], [[9617, 17400], 40.0], [[9617, 17400, 46], 40.0]]
KNOBS = {"sequence_bias": END_BIAS, "min_tokens": 16}
MESSAGES = [{"role": "user", "content": "What is the capital of France? Think first."}]
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
        "additionalProperties": False}  # fmt: skip


@pytest.fixture(scope="module")
def client(smollm2, tmp_path_factory):
    template = tmp_path_factory.mktemp("reasoning") / "think.jinja"
    template.write_text(TEMPLATE)
    base, proc = start_server("--max-model-len", "2048", "--reasoning-parser", "deepseek_r1",
                              "--chat-template", str(template))  # fmt: skip
    yield openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    stop_server(proc)


@pytest.fixture(scope="module")
def base(client):
    return str(client.base_url).removesuffix("/v1/")


def reply_text(smollm2, token_ids: list[int]) -> str:
    return smollm2.tokenizer.decode(token_ids, skip_special_tokens=True)


def chat(client: openai.OpenAI, **fields):  # noqa: ANN201
    fields = {"max_tokens": 80, **fields, "extra_body": {**KNOBS, **fields.get("extra_body", {})}}
    return client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, **fields)


def test_chat_splits_the_reply_exactly_streamed_and_not(client, smollm2):
    body = chat(client, extra_body={"return_token_ids": True})
    choice = body.choices[0]
    raw = reply_text(smollm2, choice.model_extra["token_ids"])
    thinking, _, answer = raw.partition("</think>")
    assert thinking and answer.strip(), f"the reply did not think then answer: {raw!r}"
    message = choice.message
    assert message.model_extra["reasoning_content"] == message.model_extra["reasoning"] == thinking
    assert message.content == answer.lstrip()
    assert "<think>" not in message.content and "</think>" not in message.content

    chunks = list(chat(client, stream=True))
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    streamed_thinking = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert streamed_thinking == "".join((d.model_extra or {}).get("reasoning") or "" for d in deltas) == thinking
    assert "".join(d.content or "" for d in deltas) == message.content
    last_thinking = max(i for i, d in enumerate(deltas) if (d.model_extra or {}).get("reasoning_content"))
    first_content = min(i for i, d in enumerate(deltas) if d.content)
    assert last_thinking < first_content


def test_the_responses_api_gives_a_reasoning_item_before_the_message(client):
    message = chat(client).choices[0].message
    request = dict(model=MODEL, input=MESSAGES[0]["content"], temperature=0, max_output_tokens=80, extra_body=KNOBS)
    response = client.responses.create(**request)
    reasoning, output = response.output
    assert reasoning.type == "reasoning" and reasoning.summary == [] and reasoning.status == "completed"
    assert [part.text for part in reasoning.content] == [message.model_extra["reasoning_content"]]
    assert output.type == "message" and response.output_text == message.content

    with client.responses.stream(**request) as stream:
        events = list(stream)
        final = stream.get_final_response()
    thinking = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    done = [e.text for e in events if e.type == "response.reasoning_text.done"]
    assert thinking == done[0] == message.model_extra["reasoning_content"]
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text == message.content


def test_a_json_schema_constrains_the_answer_not_the_thinking(client, smollm2):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    for stream in (False, True):
        request = dict(response_format=fmt, max_tokens=120, extra_body={"return_token_ids": True})
        if not stream:
            choice = chat(client, **request).choices[0]
            thinking, content = choice.message.model_extra["reasoning_content"], choice.message.content
            raw = reply_text(smollm2, choice.model_extra["token_ids"])
        else:
            deltas = [c.choices[0].delta for c in chat(client, stream=True, **request) if c.choices]
            thinking = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
            content = "".join(d.content or "" for d in deltas)
            raw = None
        assert thinking and not thinking.lstrip().startswith("{")  # free text, which the schema would refuse
        jsonschema.validate(json.loads(content), CITY)
        if raw is not None:
            assert raw == f"{thinking}</think>{content}"


def test_the_messages_api_gives_a_thinking_block_before_the_text(client, base):
    message = chat(client).choices[0].message
    anthropic_client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    request = dict(model=MODEL, max_tokens=80, messages=MESSAGES, extra_body={"temperature": 0, **KNOBS})
    reply = anthropic_client.messages.create(**request)
    thinking, text = reply.content
    assert thinking.type == "thinking" and thinking.thinking == message.model_extra["reasoning_content"]
    assert text.type == "text" and text.text == message.content and reply.stop_reason == "end_turn"
    with anthropic_client.messages.stream(**request) as stream:
        deltas = [e.delta.thinking for e in stream
                  if e.type == "content_block_delta" and e.delta.type == "thinking_delta"]  # fmt: skip
        final = stream.get_final_message()
    assert "".join(deltas) == thinking.thinking
    assert [block.model_dump() for block in final.content] == [block.model_dump() for block in reply.content]


def test_enable_thinking_false_renders_no_thinking_and_splits_nothing(client):
    """chat_template_kwargs reach the template (here: no ``<think>`` opened), and a request that turned
    thinking off gets its whole reply as the answer."""
    thinking = chat(client, max_tokens=20)
    plain = chat(client, max_tokens=20, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert plain.usage.prompt_tokens < thinking.usage.prompt_tokens  # the template opened no <think>
    message = plain.choices[0].message
    assert message.content and getattr(message, "reasoning_content", None) is None
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, max_tokens=20, extra_body={"chat_template_kwargs": {"messages": []}})
    assert refused.value.body["param"] == "chat_template_kwargs.messages"


# ---- issue 50 -------------------------------------------------------------------------------------
END_IDS = [9617, 17400, 46]  # SmolLM2's "</", "think", ">"
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                            "required": ["city"], "additionalProperties": False}}  # fmt: skip


@pytest.fixture(scope="module")
def claude(base):  # noqa: ANN201
    return anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)


THE = 260  # SmolLM2's " the": a run of it re-encodes to exactly as many tokens


def always_the(vocab_size: int) -> LlamaForCausalLM:
    """A tiny random Llama whose greedy next token is " the" after any text: every embedding shares one
    direction, the only one the final norm keeps, and the head reads it as " the". So it never closes its
    thinking by itself (as SmolLM2 here) and its thinking re-encodes to the tokens it wrote."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.lm_head.weight[THE, 0] = 1.0
    return model


@pytest.fixture(scope="module")
def thinker(smollm2, tmp_path_factory):  # noqa: ANN201
    """The anthropic client of a server like ``client``'s (same template, parser and served name) on
    ``always_the`` with SmolLM2's tokenizer (its ``</think>`` ids). One torch thread: a model this small
    gains nothing from a second, and on a busy machine two spin against each other (a step took ~90 ms
    instead of ~10)."""
    folder = tmp_path_factory.mktemp("thinker")
    always_the(len(smollm2.tokenizer)).save_pretrained(folder / "model")
    smollm2.tokenizer.__class__.from_pretrained(smollm2.tokenizer.name_or_path).save_pretrained(folder / "model")
    (folder / "think.jinja").write_text(TEMPLATE)
    base, proc = start_server("--model", str(folder / "model"), "--served-model-name", MODEL, "--max-model-len", "2048",
                              "--reasoning-parser", "deepseek_r1", "--chat-template", str(folder / "think.jinja"),
                              "--num-threads", "1", log=folder / "server.log")  # fmt: skip
    yield anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    stop_server(proc)


def test_usage_counts_the_reasoning_tokens_on_chat_and_responses(client, smollm2):
    """Every token up to the end of ``</think>`` and the whitespace after it is the thinking's."""
    body = chat(client, extra_body={"return_token_ids": True})
    ids = body.choices[0].model_extra["token_ids"]
    end = next(i + len(END_IDS) for i in range(len(ids)) if ids[i : i + len(END_IDS)] == END_IDS)
    while not smollm2.tokenizer.decode(ids[end : end + 1]).strip():
        end += 1  # the separator after the tag
    assert body.usage.completion_tokens_details.reasoning_tokens == end < body.usage.completion_tokens
    streamed = [c for c in chat(client, stream=True, stream_options={"include_usage": True}) if c.usage]
    assert streamed[-1].usage.completion_tokens_details.reasoning_tokens == end
    request = dict(model=MODEL, input=MESSAGES[0]["content"], temperature=0, max_output_tokens=80, extra_body=KNOBS)
    assert client.responses.create(**request).usage.output_tokens_details.reasoning_tokens == end


def test_enabled_thinking_is_cut_at_its_budget_and_the_answer_follows(thinker, smollm2):
    """Without the budget the model thinks on to ``max_tokens`` (``min_tokens`` keeps it from
    stopping): the engine forces ``</think>`` once 1024 tokens are spent, and the answer follows."""
    budget = 1024
    reply = thinker.messages.create(model=MODEL, max_tokens=1100, messages=MESSAGES,
                                   thinking={"type": "enabled", "budget_tokens": budget},
                                   extra_body={"temperature": 0, "min_tokens": budget + 8})  # fmt: skip
    thinking, text = reply.content
    assert thinking.type == "thinking" and text.type == "text" and text.text.strip()
    thought = len(smollm2.tokenizer.encode(thinking.thinking, add_special_tokens=False))
    assert budget - 16 <= thought <= budget  # its own tokens re-encoded; the tag forced right after them
    assert "</think>" not in text.text and reply.usage.output_tokens <= 1100


def test_disabled_thinking_is_no_thinking(claude):
    request = dict(model=MODEL, max_tokens=20, messages=MESSAGES, extra_body={"temperature": 0})
    thinking_on = claude.messages.count_tokens(model=MODEL, messages=MESSAGES).input_tokens
    thinking_off = claude.messages.count_tokens(model=MODEL, messages=MESSAGES, thinking={"type": "disabled"})
    assert thinking_off.input_tokens < thinking_on  # the template opened no <think>
    reply = claude.messages.create(**request, thinking={"type": "disabled"})
    assert [block.type for block in reply.content] == ["text"] and reply.content[0].text
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(**request, thinking={"type": "enabled", "budget_tokens": 1024})
    assert "max_tokens" in refused.value.message  # Anthropic's rule: the budget is below max_tokens


def test_a_tool_loops_second_turn_sends_the_thinking_back(claude):
    """Turn 1 thinks and calls (``any``: the call grammar after the thinking); turn 2 sends the assistant
    turn back as the SDK returned it, thinking block included, with the tool's result."""
    request = dict(model=MODEL, max_tokens=120, tools=[WEATHER], extra_body={"temperature": 0, **KNOBS})
    first = claude.messages.create(**request, messages=MESSAGES, tool_choice={"type": "any"})
    assert [block.type for block in first.content] == ["thinking", "tool_use"] and first.stop_reason == "tool_use"
    call = first.content[1]
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "18 C"}
    turns = [*MESSAGES, {"role": "assistant", "content": first.content}, {"role": "user", "content": [result]}]
    second = claude.messages.create(**request, messages=turns)
    assert second.content and second.stop_reason in ("end_turn", "tool_use", "max_tokens")
    as_dicts = [*MESSAGES, {"role": "assistant", "content": [b.model_dump() for b in first.content]}, turns[-1]]
    assert claude.messages.count_tokens(model=MODEL, messages=as_dicts, tools=[WEATHER]).input_tokens > 0
