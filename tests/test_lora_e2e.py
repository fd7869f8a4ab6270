"""End to end: ``decoda serve`` with the embedded SmolLM2 and a seeded PEFT adapter made for it, driven by the
real openai client (and the anthropic one on the Messages API): ``model="NAME"`` gives PEFT's tokens; adapters
loaded and unloaded while serving."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import openai
import pytest
import torch

from decoding.params.structured import StructuredOutput
from decoding.structured.compiler import GrammarCompiler
from tests.test_e2e_openai import start_server, stop_server
from tests.test_lora_engine import make_adapter
from tests.test_structured_engine import EOS, VOCAB, hf_constrained_greedy

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "smollm2-135m-instruct"
KEY = "lora-key"
ADMIN = "lora-admin-key"  # --admin-api-key: the only key that may load and unload adapters
TARGETS = ["q_proj", "v_proj", "o_proj", "down_proj"]
MESSAGES = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def adapters(smollm2, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-dir")
    tone = make_adapter(smollm2.model, root / "tone", seed=5, r=8, alpha=16, targets=TARGETS, b_std=0.1)
    other = make_adapter(smollm2.model, root / "other", seed=6, r=4, alpha=8, targets=TARGETS, b_std=0.1)
    return root, tone, other


@pytest.fixture(scope="module")
def server(adapters):
    root, _, _ = adapters
    base, proc = start_server("--max-model-len", "1024", "--lora-modules", f"tone={root / 'tone'}",
                              "--lora-dir", str(root), "--enable-lora-loading", "--api-key", KEY,
                              "--admin-api-key", ADMIN)  # fmt: skip
    yield base
    stop_server(proc)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)


def _peft_chat(model: torch.nn.Module, tokenizer: object, max_new_tokens: int) -> list[int]:
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=max_new_tokens, do_sample=False)  # fmt: skip
    return out[0, len(ids) :].tolist()


def test_models_lists_the_adapter_with_its_parent(client):
    models = {m.id: m for m in client.models.list().data}
    assert models["tone"].model_extra["parent"] == MODEL
    assert models[MODEL].model_extra["parent"] is None


def test_chat_with_the_adapter_gives_peft_tokens(client, adapters, smollm2):
    _, tone, _ = adapters
    reply = client.chat.completions.create(model="tone", messages=MESSAGES, max_tokens=12, temperature=0,
                                           extra_body={"return_token_ids": True})  # fmt: skip
    expected = _peft_chat(tone, smollm2.tokenizer, 12)
    assert reply.model == "tone"
    assert reply.choices[0].model_extra["token_ids"] == expected
    base = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0,
                                          extra_body={"return_token_ids": True})  # fmt: skip
    assert base.choices[0].model_extra["token_ids"] != expected


COLOUR = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}}, "required": ["colour"],
          "additionalProperties": False}  # fmt: skip


def test_a_json_schema_with_the_adapter_is_obeyed_and_gives_peft_tokens_under_the_same_mask(client, adapters, smollm2):
    _, tone, _ = adapters
    reply = client.chat.completions.create(
        model="tone", messages=MESSAGES, max_tokens=40, temperature=0, extra_body={"return_token_ids": True},
        response_format={"type": "json_schema", "json_schema": {"name": "colour", "schema": COLOUR}},
    )  # fmt: skip
    choice = reply.choices[0]
    assert reply.model == "tone" and choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), COLOUR)
    ids = smollm2.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    compiler = GrammarCompiler(smollm2.tokenizer, VOCAB, [EOS])
    expected = hf_constrained_greedy(tone, compiler, StructuredOutput("json", COLOUR), ids, 40)
    assert expected[-1] == EOS and choice.model_extra["token_ids"] == expected[:-1]


def test_messages_api_with_the_adapter_gives_peft_tokens(server, adapters, smollm2):
    _, tone, _ = adapters
    client = anthropic.Anthropic(base_url=server, api_key=KEY, max_retries=0)
    message = client.messages.create(model="tone", max_tokens=12, messages=MESSAGES, extra_body={"temperature": 0})
    expected = smollm2.tokenizer.decode(_peft_chat(tone, smollm2.tokenizer, 12), skip_special_tokens=True)
    assert message.model == "tone"
    assert "".join(block.text for block in message.content if block.type == "text") == expected
    base = client.messages.create(model=MODEL, max_tokens=12, messages=MESSAGES, extra_body={"temperature": 0})
    assert base.model == MODEL and base.content[0].text != expected
    assert client.messages.count_tokens(model="tone", messages=MESSAGES).input_tokens > 0
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="nope", max_tokens=2, messages=MESSAGES)
    assert missing.value.body["type"] == "error" and missing.value.body["error"]["type"] == "not_found_error"
    assert "tone" in missing.value.body["error"]["message"]


def test_load_use_and_unload_while_serving(server, client, adapters, smollm2):
    _, _, other = adapters
    plain = httpx.post(f"{server}/v1/load_lora_adapter", json={"lora_name": "other", "lora_path": "other"},
                       headers={"Authorization": f"Bearer {KEY}"}, timeout=60)  # fmt: skip
    assert plain.status_code == 403 and plain.json()["error"]["code"] == "admin_key_required"
    headers = {"Authorization": f"Bearer {ADMIN}"}
    loaded = httpx.post(f"{server}/v1/load_lora_adapter", json={"lora_name": "other", "lora_path": "other"},
                        headers=headers, timeout=60)  # fmt: skip
    assert loaded.status_code == 200, loaded.text
    reply = client.chat.completions.create(model="other", messages=MESSAGES, max_tokens=8, temperature=0,
                                           extra_body={"return_token_ids": True})  # fmt: skip
    assert reply.choices[0].model_extra["token_ids"] == _peft_chat(other, smollm2.tokenizer, 8)
    stream = client.chat.completions.create(model="other", messages=MESSAGES, max_tokens=48, stream=True,
                                            extra_body={"ignore_eos": True})  # fmt: skip
    chunks = iter(stream)
    next(chunks)  # the request is in flight
    busy = httpx.post(f"{server}/v1/unload_lora_adapter", json={"lora_name": "other"}, headers=headers, timeout=60)
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "lora_in_use"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text  # the stream ran to its end on its adapter
    done = httpx.post(f"{server}/v1/unload_lora_adapter", json={"lora_name": "other"}, headers=headers, timeout=60)
    assert done.status_code == 200, done.text
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=MESSAGES, max_tokens=2)
    outside = httpx.post(f"{server}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/etc"},
                         headers=headers, timeout=60)  # fmt: skip
    assert outside.status_code == 400 and outside.json()["error"]["param"] == "lora_path"
