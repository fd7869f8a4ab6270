"""Vision-language models served end to end: ``decoda serve --model FOLDER`` on a tiny LLaVA and a tiny
Gemma 3 (``tests/vlm_families.py``), asked with the real ``openai`` and ``anthropic`` clients.

A chat ``image_url`` (a data: URL), a Responses ``input_image`` and a Messages ``image`` block give the tokens
``generate()`` gives on the same folder and image; streaming gives the same; a second Responses turn
about the same image reads its image tokens from the prefix cache (usage says so); ``/tokenize`` counts the
image tokens; ``/v1/models`` says the model takes images; a broken image is a 400 naming its part while a
good request beside it is answered; a completions prompt spelling the image token out is a 400. GIT, saved without a
chat template as microsoft/git-base is, answers a chat with one image as ``generate()`` answers its documented prompt.
"""

from __future__ import annotations

import base64
import io
import json
import re
import threading

import anthropic
import httpx
import openai
import pytest

from tests import vlm_families as vf
from tests.shared_servers import SharedServers
from tests.test_git_prompt import IMAGE_POSITIONS, bare_git, documented

pytestmark = pytest.mark.e2e

MAX_TOKENS = 8
FAMILIES = ("llava", "gemma3")


def png(seed: int) -> bytes:
    buffer = io.BytesIO()
    vf.make_image(seed).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(seed: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png(seed)).decode()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """family -> (base URL, folder)."""
    root = tmp_path_factory.mktemp("vision")
    servers = SharedServers(root)
    try:
        out = {}
        for name in FAMILIES:
            folder = vf.BY_NAME[name].save(root / name)
            out[name] = (servers.base_url("--model", str(folder), "--max-model-len", "256"), str(folder))
        yield out
    finally:
        servers.stop_all()


@pytest.fixture(params=FAMILIES)
def family(request, served):
    base, folder = served[request.param]
    return request.param, base, folder


def expected_ids(folder: str, text: str, seed: int) -> list[int]:
    """generate()'s greedy tokens, without the eos that ends them (the API's ids do not carry it)."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    tokens = vf.hf_generate(folder, messages, [vf.make_image(seed)], max_new_tokens=MAX_TOKENS, do_sample=False)
    _, model = vf.load(folder)
    eos = model.generation_config.eos_token_id
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


def expected_text(folder: str, text: str, seed: int) -> str:
    processor, _ = vf.load(folder)
    return processor.tokenizer.decode(expected_ids(folder, text, seed), skip_special_tokens=True)


def chat_image(text: str, seed: int) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(seed), "detail": "auto"}},
                                         {"type": "text", "text": text}]}]  # fmt: skip


def test_chat_with_an_image_equals_generate(family):
    name, base, folder = family
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
    out = client.chat.completions.create(model=name, messages=chat_image("What is this?", 1), max_tokens=MAX_TOKENS,
                                         temperature=0, extra_body={"return_token_ids": True})  # fmt: skip
    choice = out.choices[0]
    assert choice.model_extra["token_ids"][: len(expected_ids(folder, "What is this?", 1))] == expected_ids(
        folder, "What is this?", 1
    )
    other = client.chat.completions.create(model=name, messages=chat_image("What is this?", 2), max_tokens=MAX_TOKENS,
                                           temperature=0, extra_body={"return_token_ids": True})  # fmt: skip
    assert other.choices[0].model_extra["token_ids"][: len(expected_ids(folder, "What is this?", 2))] == (
        expected_ids(folder, "What is this?", 2)
    )


def test_streaming_chat_with_an_image_equals_the_reply(family):
    name, base, _ = family
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
    kwargs = dict(model=name, messages=chat_image("Describe.", 3), max_tokens=MAX_TOKENS, temperature=0)
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        **kwargs, stream=True) if chunk.choices)  # fmt: skip
    assert streamed == whole


def images_encoded(base: str) -> float:
    metrics = httpx.get(f"{base}/metrics", timeout=30).text
    return float(re.search(r"^decoda_images_encoded_total (\S+)$", metrics, re.M).group(1))


def test_responses_input_image_and_a_second_turn_from_the_cache(family):
    name, base, folder = family
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
    before = images_encoded(base)
    first = client.responses.create(model=name, temperature=0, max_output_tokens=MAX_TOKENS, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": data_url(4), "detail": "auto"},
                                     {"type": "input_text", "text": "What is this?"}]}])  # fmt: skip
    assert first.output_text == expected_text(folder, "What is this?", 4)
    second = client.responses.create(model=name, temperature=0, max_output_tokens=MAX_TOKENS,
                                     previous_response_id=first.id, input="And now?")  # fmt: skip
    image_tokens = vf.BY_NAME[name].image_tokens
    assert second.usage.input_tokens_details.cached_tokens >= image_tokens  # the image's tokens came from cache
    assert images_encoded(base) == before + 1  # the first turn's image only: the second ran no vision tower


def test_messages_image_block_gives_the_chat_answer(family):
    name, base, folder = family
    client = anthropic.Anthropic(base_url=base, api_key="x")
    out = client.messages.create(model=name, max_tokens=MAX_TOKENS, extra_body={"do_sample": False}, messages=[
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(png(5)).decode()}},
            {"type": "text", "text": "What is this?"}]}])  # fmt: skip
    assert "".join(block.text for block in out.content if block.type == "text") == expected_text(
        folder, "What is this?", 5
    )


def test_tokenize_counts_the_image_tokens_and_models_says_images(family):
    name, base, folder = family
    body = {"model": name, "messages": chat_image("Hi", 6), "add_generation_prompt": True}
    counted = httpx.post(f"{base}/tokenize", json=body, timeout=60).json()
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    assert counted["count"] == vf.hf_inputs(folder, messages, [vf.make_image(6)])["input_ids"].shape[1]
    entry = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]
    assert "image" in entry["input_modalities"]


def test_a_broken_image_is_a_400_naming_its_part_and_harms_no_other_request(served):
    base, folder = served["llava"]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
    good: list[str] = []

    def ask() -> None:
        reply = client.chat.completions.create(model="llava", messages=chat_image("Go on.", 7), max_tokens=MAX_TOKENS,
                                               temperature=0)  # fmt: skip
        good.append(reply.choices[0].message.content)

    thread = threading.Thread(target=ask)
    thread.start()
    broken = "data:image/png;base64," + base64.b64encode(png(8)[:60]).decode()
    messages = [{"role": "user", "content": [{"type": "text", "text": "x"},
                                             {"type": "image_url", "image_url": {"url": broken}}]}]  # fmt: skip
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="llava", messages=messages, max_tokens=4)
    thread.join(120)
    assert error.value.body["param"] == "messages[0].content[1]"
    assert good == [expected_text(folder, "Go on.", 7)]


def test_a_completions_prompt_spelling_the_image_token_is_a_400(served):
    base, _ = served["llava"]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
    with pytest.raises(openai.BadRequestError) as error:
        client.completions.create(model="llava", prompt="look <image> here", max_tokens=4)
    assert error.value.body["param"] == "prompt"


def test_structured_output_and_a_forced_tool_call_with_an_image(served):
    """The grammar constrains an image request's tokens as any other's: a JSON schema's answer parses and fits,
    a forced tool call names the tool with arguments of its schema."""
    base, _ = served["llava"]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 8}},
              "required": ["colour"], "additionalProperties": False}  # fmt: skip
    out = client.chat.completions.create(
        model="llava", messages=chat_image("Which colour?", 9), max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}},
    )  # fmt: skip
    answer = json.loads(out.choices[0].message.content)
    assert set(answer) == {"colour"} and isinstance(answer["colour"], str)
    tool = {"type": "function", "function": {"name": "describe", "parameters": schema}}
    called = client.chat.completions.create(model="llava", messages=chat_image("Describe.", 9), max_tokens=120,
                                            temperature=0, tools=[tool], tool_choice="required")  # fmt: skip
    (call,) = called.choices[0].message.tool_calls
    assert call.function.name == "describe" and set(json.loads(call.function.arguments)) == {"colour"}


def test_a_text_only_chat_on_a_vision_model_equals_generate(served):
    base, folder = served["llava"]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
    question = [{"role": "user", "content": "Only words."}]
    out = client.chat.completions.create(model="llava", messages=question, max_tokens=MAX_TOKENS, temperature=0,
                                         extra_body={"return_token_ids": True})  # fmt: skip
    tokens = vf.hf_generate(folder, [{"role": "user", "content": "Only words."}], [], max_new_tokens=MAX_TOKENS,
                            do_sample=False)  # fmt: skip
    assert out.choices[0].model_extra["token_ids"] == tokens[: len(out.choices[0].model_extra["token_ids"])]
    assert len(out.choices[0].model_extra["token_ids"]) >= min(len(tokens), MAX_TOKENS) - 1


@pytest.fixture(scope="module")
def git_served(tmp_path_factory):
    """(base URL, folder) of a tiny GIT saved as microsoft/git-base is: no chat template."""
    root = tmp_path_factory.mktemp("git")
    servers = SharedServers(root)
    try:
        folder = bare_git(root / "git")
        yield servers.base_url("--model", folder, "--max-model-len", "256"), folder
    finally:
        servers.stop_all()


def test_git_chat_with_one_image_equals_generate_on_its_documented_prompt(git_served):
    """One user message, an image part and a text part: [CLS] + the text's tokens after the image's positions
    (usage counts them), the tokens generate() gives; a system turn or a second image is a 400 naming it."""
    base, folder = git_served
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
    out = client.chat.completions.create(model="git", messages=chat_image("what is this?", 1), max_tokens=MAX_TOKENS,
                                         temperature=0, extra_body={"return_token_ids": True})  # fmt: skip
    ids, tokens = documented(folder, "what is this?", 1, MAX_TOKENS)
    eos = vf.load(folder)[1].generation_config.eos_token_id
    expected = tokens[: tokens.index(eos)] if eos in tokens else tokens
    assert out.choices[0].model_extra["token_ids"][: len(expected)] == expected and expected
    assert out.usage.prompt_tokens == IMAGE_POSITIONS + len(ids)
    system = [{"role": "system", "content": "Be brief."}, *chat_image("what is this?", 1)]
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="git", messages=system, max_tokens=4)
    assert error.value.body["param"] == "messages" and "one user message" in error.value.body["message"]
    two = chat_image("compare", 1)
    two[0]["content"].insert(1, {"type": "image_url", "image_url": {"url": data_url(2)}})
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="git", messages=two, max_tokens=4)
    assert error.value.body["param"] == "messages[0].content[1]" and "one image" in error.value.body["message"]
