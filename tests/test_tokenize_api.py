"""``POST /tokenize`` and ``POST /detokenize`` in vLLM's shapes: against a fake engine (every field and
error), then end to end with the embedded model (the round trip equals the tokenizer's own, and a
conversation's count equals what ``/v1/chat/completions`` reports as ``prompt_tokens``)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from server.app import create_app
from server.config.settings import Settings
from tests.fake_engine import WORDS, FakeEngineClient
from tests.shared_servers import PLAIN, PLAIN_MAX_MODEL_LEN

ASK = [{"role": "user", "content": "hello world"}]
TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


class TemplateEngine(FakeEngineClient):
    """The fake's word tokenizer, with the chat options /tokenize passes recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.rendered: list[dict] = []

    async def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([0] if add_special_tokens else []) + self._words(text)

    async def apply_chat_template(self, messages, tools=None, *, add_generation_prompt=True, add_special_tokens=False):
        self.rendered.append({"tools": tools, "add_generation_prompt": add_generation_prompt,
                              "add_special_tokens": add_special_tokens})  # fmt: skip
        ids = [t for m in messages for t in self._words(m["content"])]
        return ([0] if add_special_tokens else []) + ids + ([6] if add_generation_prompt else [])

    async def token_strings(self, token_ids: list[int]) -> list[str]:
        return [f"<{WORDS[t]}>" for t in token_ids]


def post(engine: FakeEngineClient, path: str, body: dict) -> httpx.Response:
    async def go() -> httpx.Response:
        app = create_app(Settings(), engine_client=engine)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            return await http.post(path, json=body)

    return asyncio.run(go())


def error_of(response: httpx.Response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_a_prompt_is_tokenized_with_special_tokens_by_default_and_strings_on_request():
    engine = TemplateEngine()
    body = post(engine, "/tokenize", {"prompt": "hello world"}).json()
    assert body == {"count": 3, "max_model_len": 64, "tokens": [0, 1, 2], "token_strs": None}
    body = post(engine, "/tokenize", {"model": "fake-model", "prompt": "hello world", "add_special_tokens": False,
                                      "return_token_strs": True}).json()  # fmt: skip
    assert body == {"count": 2, "max_model_len": 64, "tokens": [1, 2], "token_strs": ["<hello>", "<world>"]}


def test_messages_go_through_the_chat_template_with_its_options():
    engine = TemplateEngine()
    assert post(engine, "/tokenize", {"messages": ASK}).json()["tokens"] == [1, 2, 6]
    body = post(engine, "/tokenize", {"messages": ASK, "add_generation_prompt": False, "add_special_tokens": True,
                                      "tools": [TOOL]}).json()  # fmt: skip
    assert body["tokens"] == [0, 1, 2]
    assert engine.rendered == [
        {"tools": None, "add_generation_prompt": True, "add_special_tokens": False},
        {"tools": [TOOL], "add_generation_prompt": False, "add_special_tokens": True},
    ]


@pytest.mark.parametrize(("body", "param"), [
    ({}, "prompt"),
    ({"prompt": "hello", "messages": ASK}, "prompt"),
    ({"messages": []}, "messages"),
    ({"prompt": "hello", "tools": [TOOL]}, "tools"),
    ({"prompt": "hello", "add_generation_prompt": False}, "add_generation_prompt"),
    ({"prompt": "hello", "return_tokens": True}, "return_tokens"),
    ({"prompt": 3}, "prompt"),
])  # fmt: skip
def test_tokenize_errors_name_the_field(body, param):
    assert error_of(post(TemplateEngine(), "/tokenize", body))["param"] == param


def test_detokenize_answers_the_text_and_refuses_ids_outside_the_vocabulary():
    assert post(TemplateEngine(), "/detokenize", {"tokens": [1, 2]}).json() == {"prompt": "hello world"}
    for bad in (len(WORDS), -1):
        error = error_of(post(TemplateEngine(), "/detokenize", {"tokens": [1, bad]}))
        assert error["param"] == "tokens" and f"tokens[1] is {bad}" in error["message"]
    assert error_of(post(TemplateEngine(), "/detokenize", {}))["param"] == "tokens"


def test_another_model_is_a_404_on_both():
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]})):
        assert error_of(post(TemplateEngine(), path, {"model": "gpt-4", **body}), 404)["param"] == "model"


# ---- end to end with the embedded model ---------------------------------------------------------------
@pytest.fixture(scope="module")
def server(shared_server) -> str:
    return shared_server(*PLAIN)


@pytest.mark.e2e
@pytest.mark.slow
def test_the_round_trip_is_the_tokenizer_s_own(server, smollm2_tokenizer):
    text = "Tokenizers split words: naïve café, 1234 ✓"
    body = httpx.post(f"{server}/tokenize", json={"prompt": text, "return_token_strs": True}, timeout=30).json()
    assert body["tokens"] == smollm2_tokenizer.encode(text) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == PLAIN_MAX_MODEL_LEN  # the server's --max-model-len
    assert body["token_strs"] == smollm2_tokenizer.convert_ids_to_tokens(body["tokens"])
    back = httpx.post(f"{server}/detokenize", json={"tokens": body["tokens"]}, timeout=30).json()
    assert back == {"prompt": smollm2_tokenizer.decode(body["tokens"])}
    error = httpx.post(f"{server}/detokenize", json={"tokens": [49152]}, timeout=30).json()["error"]
    assert error["param"] == "tokens"


@pytest.mark.e2e
@pytest.mark.slow
def test_a_conversation_counts_what_chat_completions_reports(server):
    import openai

    ask = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    counts = []
    for tools in (None, [TOOL]):  # with tools, the shipped tool-capable template renders both
        extra = {"tools": tools} if tools else {}
        counted = httpx.post(f"{server}/tokenize", json={"messages": ask, **extra}, timeout=30).json()
        reply = openai.OpenAI(base_url=f"{server}/v1", api_key="unused").chat.completions.create(
            model="smollm2-135m-instruct", messages=ask, max_tokens=1, **extra
        )
        assert counted["count"] == reply.usage.prompt_tokens
        counts.append(counted["count"])
    assert counts[1] > counts[0]  # the tools are in the prompt
    without = httpx.post(f"{server}/tokenize", json={"messages": ask, "add_generation_prompt": False}, timeout=30)
    assert without.json()["count"] < counts[0] - 1  # no "<|im_start|>assistant\n" at the end
