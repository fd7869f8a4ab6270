"""custom_generate over HTTP (fake engine): extra fields become the method's arguments, or 400s naming them."""

from __future__ import annotations

import json

import pytest

from decoding.params import GenerationParams, ParameterError, validate
from decoding.params.custom_methods import CustomMethodInfo
from decoding.params.model_checks import ModelFacts, check_against_model
from tests.fake_engine import WORDS, FakeEngineClient
from tests.test_api import client_for, error_of, post, run

METHOD = CustomMethodInfo("left_padding", "config/custom_generate/left_padding", ("left_padding", "pad_token"),
                          "Greedy decoding with left padding.")  # fmt: skip


def engine() -> FakeEngineClient:
    fake = FakeEngineClient()
    fake.facts = ModelFacts(vocab_size=len(WORDS), max_model_len=64, num_layers=4, custom_methods=(METHOD,))
    return fake


COMPLETION = {"prompt": "hello world", "max_tokens": 3, "custom_generate": "left_padding"}
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, "custom_generate": "left_padding"}


@pytest.mark.parametrize(("path", "body"), [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)])
def test_extra_fields_reach_the_method_as_arguments(path, body):
    fake = engine()
    r = run(post(fake, path, {**body, "left_padding": 2, "pad_token": 0}))
    assert r.status_code == 200, r.text
    params = fake.submitted[0][2]
    assert params.custom_generate == "left_padding"
    assert params.custom_generate_args == {"left_padding": 2, "pad_token": 0}


@pytest.mark.parametrize(("path", "body"), [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)])
def test_an_argument_the_method_does_not_take_is_a_400_naming_it(path, body):
    r = run(post(engine(), path, {**body, "left_pading": 2}))
    assert r.status_code == 400
    error = error_of(r)
    assert error["param"] == "left_pading" and error["code"] == "unknown_field"
    assert "left_padding, pad_token" in error["message"]


def test_without_custom_generate_extra_fields_stay_unknown():
    r = run(post(engine(), "/v1/completions", {"prompt": "hello", "left_padding": 2}))
    assert r.status_code == 400
    assert error_of(r)["param"] == "left_padding" and error_of(r)["code"] == "unknown_field"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"custom_generate": "nope"}, "custom_generate"),
        ({"n": 2}, "n"),
        ({"stop": ["x"]}, "stop"),
        ({"logprobs": 1}, "logprobs"),
        ({"num_beams": 2, "temperature": 0}, "num_beams"),
        ({"streamer": 1}, "streamer"),
        ({"input_ids": [1]}, "input_ids"),
    ],
)
def test_what_a_custom_method_cannot_serve_is_a_400(extra, param):
    r = run(post(engine(), "/v1/completions", {**COMPLETION, **extra}))
    assert r.status_code == 400, r.text
    assert error_of(r)["param"] == param


def test_registered_methods_are_listed():
    async def get():
        async with client_for(engine()) as http:
            return await http.get("/v1/custom_generate")

    r = run(get())
    assert r.status_code == 200
    assert r.json() == {"object": "list", "data": [METHOD.as_json()]}
    assert METHOD.as_json()["arguments"] == ["left_padding", "pad_token"]


def test_any_other_knob_is_refused_rather_than_left_unused():
    """Knobs the method never sees are a 400: the OpenAI penalties by name, and any knob outside the
    generation config (here token healing, another part's field) by the generic rule."""
    with pytest.raises(ParameterError) as err:
        validate(GenerationParams(custom_generate="x", presence_penalty=0.5))
    assert err.value.param == "presence_penalty" and "cannot be combined with custom_generate" in err.value.message
    if hasattr(GenerationParams(), "token_healing"):
        with pytest.raises(ParameterError) as err:
            validate(GenerationParams(custom_generate="x", token_healing=True))
        assert err.value.param == "token_healing"
    # generation-config knobs (a model's defaults among them) go to the method in generation_config
    validate(GenerationParams(custom_generate="x", do_sample=True, temperature=0.7, top_k=5, seed=3, max_time=2.0,
                              length_penalty=2.0, early_stopping=True))  # fmt: skip


def test_a_server_default_added_after_validation_is_refused_too():
    """The server's --watermark default joins the params after validate(); the model check still refuses it."""
    if not hasattr(GenerationParams(), "watermarking_config"):
        pytest.skip("no server-side default knob to try")
    params = GenerationParams(custom_generate="left_padding").replace(watermarking_config=object())
    with pytest.raises(ParameterError) as err:
        check_against_model(params, engine().facts, [[1, 2]])
    assert err.value.param == "watermarking_config"


def test_the_listing_shows_no_server_path():
    async def get():
        async with client_for(engine()) as http:
            return await http.get("/v1/custom_generate")

    (method,) = run(get()).json()["data"]
    assert "path" not in method and METHOD.path not in json.dumps(method)
