"""Model-dependent validation lives in one function, ``decoding.params.model_checks.check_against_model``."""

from __future__ import annotations

import dataclasses

import pytest

from decoding import EngineConfig, GenerationParams, ParameterError
from decoding import params as params_module
from decoding.params import validate
from decoding.params.model_checks import ModelFacts, check_against_model

FACTS = ModelFacts(vocab_size=100, max_model_len=64, num_layers=4, max_num_seqs=8, max_num_beams=4,
                   assistants=("draft",))  # fmt: skip


@pytest.mark.parametrize(
    ("knobs", "prompt", "param", "code"),
    [
        ({}, [1, 100], "prompt", "invalid_parameter"),
        ({"bad_words_ids": [[1, 2], [200]]}, [1], "bad_words_ids", "invalid_parameter"),
        ({"suppress_tokens": [-1]}, [1], "suppress_tokens", "invalid_parameter"),
        ({"logit_bias": {100: 1.0}}, [1], "logit_bias", "invalid_parameter"),
        ({"stop_token_ids": [100]}, [1], "stop_token_ids", "invalid_parameter"),
        ({"dola_layers": [5]}, [1], "dola_layers", "invalid_parameter"),
        ({"dola_layers": [4]}, [1], "dola_layers", "invalid_parameter"),  # no premature layer
        ({"assistant_early_exit": 4}, [1], "assistant_early_exit", "invalid_parameter"),
        ({"num_beams": 5}, [1], "num_beams", "invalid_parameter"),
        ({"n": 9, "do_sample": True}, [1], "n", "invalid_parameter"),
        ({"assistant_model": "other"}, [1], "assistant_model", "model_not_found"),
        ({"max_new_tokens": 60}, [1] * 5, "prompt", "context_length_exceeded"),
        ({}, [], "prompt", "empty_prompt"),  # found by schemathesis: text that tokenizes to nothing
    ],
)
def test_each_model_check_names_its_field(knobs, prompt, param, code):
    params = GenerationParams(**knobs)
    validate(params)  # fine on its own: only the model makes it wrong
    with pytest.raises(ParameterError) as err:
        check_against_model(params, FACTS, [prompt])
    assert (err.value.param, err.value.code) == (param, code)


def test_what_the_model_allows_passes_and_the_context_error_names_the_field():
    ok = GenerationParams(max_new_tokens=10, num_beams=4, n=2, dola_layers=None, assistant_model="draft")
    check_against_model(ok, FACTS, [[1, 2, 3], [99] * 54])
    with pytest.raises(ParameterError) as err:
        check_against_model(GenerationParams(max_new_tokens=10), FACTS, [[1] * 60], prompt_param="messages")
    assert err.value.param == "messages" and "maximum context length is 64" in err.value.message
    assert "70 tokens (60 in the messages, 10 for the completion)" in err.value.message


def test_temperature_zero_with_sampling_is_a_knob_error():
    with pytest.raises(ParameterError) as err:
        validate(GenerationParams(do_sample=True, temperature=0.0))
    assert err.value.param == "temperature"


def test_dead_code_is_gone_and_later_features_answer_clearly():
    assert not hasattr(params_module, "SUPPORTED_STRATEGIES") and not hasattr(params_module, "_STRATEGY_FIELD")
    assert "seed" not in {f.name for f in dataclasses.fields(EngineConfig)}
    validate(GenerationParams(generation_preset="x"))  # [presets] a label: server/ resolved it already
    validate(GenerationParams(custom_generate="x"))  # [custom] a name: the server's registry checks it
    with pytest.raises(ParameterError) as err:
        check_against_model(GenerationParams(custom_generate="x"), ModelFacts(vocab_size=10, max_model_len=64), [[1]])
    assert err.value.param == "custom_generate" and "registered methods: none" in err.value.message


def test_a_seed_the_generator_cannot_take_is_a_400_naming_it():
    from decoding.params import validate as check

    for seed in (2**64, -(2**63) - 1, 10**30):
        with pytest.raises(ParameterError) as error:
            check(GenerationParams(do_sample=True, seed=seed))
        assert error.value.param == "seed" and str(seed) in error.value.message
    for seed in (0, 2**64 - 1, -(2**63)):
        check(GenerationParams(do_sample=True, seed=seed))
        import torch

        torch.Generator().manual_seed(seed)  # the bounds are the generator's own
