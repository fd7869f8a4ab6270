"""Structured outputs end to end: the real ``openai`` client against a real server with SmolLM2."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.shared_servers import PLAIN
from tests.test_e2e_openai import MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)
    population_millions: int = Field(ge=0, le=100)


@pytest.fixture(scope="module")
def server(shared_server) -> str:
    return shared_server(*PLAIN)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_parse_returns_the_pydantic_object(client):
    completion = client.chat.completions.parse(
        model=MODEL, messages=ask("Describe Paris as JSON."), response_format=City, max_tokens=120, temperature=0
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, City)


@pytest.mark.parametrize(
    "knobs", [{}, {"num_beams": 3}, {"penalty_alpha": 0.6, "top_k": 4}, {"prompt_lookup_num_tokens": 3}],
    ids=["greedy", "beam", "contrastive", "prompt_lookup"],
)
def test_json_schema_holds_under_other_strategies(client, knobs):
    schema = City.model_json_schema()
    completion = client.chat.completions.create(
        model=MODEL, messages=ask("Describe Rome as JSON."), max_tokens=120, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}},
        extra_body=knobs,
    )  # fmt: skip
    assert completion.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(completion.choices[0].message.content), schema)


def test_json_object_mode_and_seeded_sampling(client):
    completion = client.chat.completions.create(
        model=MODEL, messages=ask("Give me a JSON object about cats."), max_tokens=200, temperature=0.8, seed=3,
        response_format={"type": "json_object"},
    )  # fmt: skip
    if completion.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(completion.choices[0].message.content), dict)
    else:  # max_tokens cut the object: OpenAI's behaviour, documented
        assert completion.choices[0].finish_reason == "length"


def test_regex_and_choice_through_extra_body(client):
    regex = client.chat.completions.create(
        model=MODEL, messages=ask("A US phone number?"), max_tokens=30, temperature=0,
        extra_body={"structured_outputs": {"regex": r"\(\d{3}\) \d{3}-\d{4}"}},
    )  # fmt: skip
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", regex.choices[0].message.content)
    choice = client.completions.create(
        model=MODEL, prompt="Is the sky blue? Answer:", max_tokens=10, temperature=0,
        extra_body={"structured_outputs": {"choice": [" yes", " no"]}},
    )  # fmt: skip
    assert choice.choices[0].text in (" yes", " no") and choice.choices[0].finish_reason == "stop"


def test_streamed_json_equals_the_non_streamed(client):
    schema = {"name": "c", "schema": City.model_json_schema(), "strict": True}
    request = dict(model=MODEL, messages=ask("Describe Oslo as JSON."), max_tokens=120, temperature=0,
                   response_format={"type": "json_schema", "json_schema": schema})  # fmt: skip
    whole = client.chat.completions.create(**request).choices[0].message.content
    stream = client.chat.completions.create(**request, stream=True)
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces) == whole
    City.model_validate_json(whole)


def test_a_bad_schema_is_a_400_naming_response_format(client, server):
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(
            model=MODEL, messages=ask("hi"), max_tokens=5,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
        )  # fmt: skip
    assert error.value.body["param"] == "response_format"
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 5, "structured_outputs": {"regex": "a(b"}}
    answer = httpx.post(f"{server}/v1/completions", json=body, timeout=30)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "structured_outputs"


def cache_hits(server: str) -> float:
    text = httpx.get(f"{server}/metrics", timeout=10).text
    hits = re.search(r'^decoda_structured_output_compiles_total\{cached="true"\} (\S+)$', text, re.M)
    return float(hits.group(1)) if hits else 0.0


def test_compiles_are_counted_with_cache_hits(client, server):
    before = cache_hits(server)  # a shared server: other modules' compiles are counted too
    for _ in range(2):
        client.completions.create(model=MODEL, prompt="Pick:", max_tokens=5, temperature=0,
                                  extra_body={"structured_outputs": {"choice": ["red", "blue"]}})  # fmt: skip
    assert cache_hits(server) >= before + 1
