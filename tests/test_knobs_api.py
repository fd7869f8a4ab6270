"""Issue 11's GenerationConfig knobs over HTTP: HF's names and JSON shapes reach the engine, bad
values are a 400 naming the field, lengths follow HF's precedence, model defaults apply."""

from __future__ import annotations

import pytest

from tests.fake_engine import FakeEngineClient
from tests.test_api import MODEL, error_of, post, run


def submit(body: dict, engine: FakeEngineClient | None = None):  # noqa: ANN201
    engine = engine or FakeEngineClient()
    response = run(post(engine, "/v1/completions", {"model": MODEL, "prompt": "hello world", **body}))
    return response, (engine.submitted[-1][2] if engine.submitted else None)


def test_every_knob_reaches_the_engine_by_its_hf_name():
    response, params = submit({
        "stop_strings": "end", "sequence_bias": [[[1, 2], -3], [[4], 1.5]],
        "exponential_decay_length_penalty": [2, 1.2], "begin_suppress_tokens": [5], "forced_bos_token_id": 6,
        "forced_eos_token_id": [7, 0], "renormalize_logits": True, "min_length": 4, "max_length": 9,
    })  # fmt: skip
    assert response.status_code == 200, response.text
    assert params.stop_strings == ["end"] and params.stop == []
    assert params.sequence_bias == [[[1, 2], -3.0], [[4], 1.5]]
    assert params.exponential_decay_length_penalty == (2, 1.2)
    assert (params.begin_suppress_tokens, params.forced_bos_token_id, params.forced_eos_token_id) == ([5], 6, [7, 0])
    assert (params.renormalize_logits, params.min_length, params.max_length) == (True, 4, 9)


def test_length_precedence_is_hfs():
    _, params = submit({"max_length": 9, "max_tokens": 3, "min_length": 4, "min_tokens": 1})
    assert (params.max_new_tokens, params.max_length, params.min_new_tokens, params.min_length) == (3, None, 1, 0)
    _, params = submit({"max_length": 9, "min_length": 4})
    assert (params.max_length, params.min_length, params.min_new_tokens) == (9, 4, 0)
    response, params = submit({"max_length": 40, "min_tokens": 20})  # past the completions default of 16
    assert response.status_code == 200 and (params.max_length, params.min_new_tokens) == (40, 20)


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"sequence_bias": [[[], 1.0]]}, "sequence_bias", "non-empty"),
        ({"sequence_bias": [[[-1], 1.0]]}, "sequence_bias", "non-negative"),
        ({"sequence_bias": [[[1], 1.0], [[1], 2.0]]}, "sequence_bias", "twice"),
        ({"sequence_bias": [[[500], 1.0]]}, "sequence_bias", "[0, 99]"),
        ({"exponential_decay_length_penalty": [-1, 1.5]}, "exponential_decay_length_penalty", "start_index >= 0"),
        ({"exponential_decay_length_penalty": [1, 0]}, "exponential_decay_length_penalty", "decay_factor > 0"),
        ({"begin_suppress_tokens": [-2]}, "begin_suppress_tokens", ">= 0"),
        ({"begin_suppress_tokens": [100]}, "begin_suppress_tokens", "[0, 99]"),
        ({"forced_bos_token_id": 100}, "forced_bos_token_id", "[0, 99]"),
        ({"forced_eos_token_id": []}, "forced_eos_token_id", "non-empty list"),
        ({"forced_eos_token_id": -1}, "forced_eos_token_id", ">= 0"),
        ({"stop_strings": [""]}, "stop_strings", "non-empty"),
        ({"max_length": 0}, "max_length", ">= 1"),
        ({"max_length": 2}, "max_length", "must exceed its length (2 tokens"),
        ({"min_length": -1}, "min_length", ">= 0"),
        ({"min_length": 9, "max_length": 5}, "min_length", "must not exceed max_length"),
        ({"max_length": 100}, "prompt", "maximum context length"),
        ({"token_healing": True}, "token_healing", "not supported"),
        ({"max_length": 5, "min_tokens": 4}, "min_tokens", "must not exceed max_length (5)"),
    ],
)
def test_bad_values_are_a_400_naming_the_field(body, param, words):
    response, _ = submit(body)
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["param"] == param and words in error["message"], error


def test_model_generation_config_defaults_apply_below_the_request():
    engine = FakeEngineClient()
    engine.generation_defaults = {
        "sequence_bias": [[[1], 2.0]], "no_repeat_ngram_size": 3, "min_new_tokens": 2, "max_new_tokens": 5,
        "stop_strings": ["end"], "renormalize_logits": True, "length_penalty": 0.5, "diversity_penalty": 1.0,
    }  # fmt: skip
    response, params = submit({}, engine)
    assert response.status_code == 200, response.text
    assert params.sequence_bias == [[[1], 2.0]] and params.no_repeat_ngram_size == 3
    assert (params.min_new_tokens, params.max_new_tokens, params.stop_strings) == (2, 5, ["end"])
    assert params.renormalize_logits and params.length_penalty == 0.5
    assert params.diversity_penalty == 0.0  # only for a request that asks for diverse beam search itself
    _, params = submit({"no_repeat_ngram_size": 0, "max_tokens": 2, "min_length": 3, "sequence_bias": None}, engine)
    assert (params.no_repeat_ngram_size, params.max_new_tokens) == (0, 2)
    assert (params.min_new_tokens, params.min_length) == (0, 3)  # the request's min_length beats the model's
