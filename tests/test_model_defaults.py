"""The model's generation_config.json: every key used as a request default or logged with a reason."""

from __future__ import annotations

import logging

import pytest
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from decoding.params.model_defaults import HONOURED, IGNORED_REASONS, log_generation_defaults, split_generation_defaults
from server.translate.fields import GenerationFields
from tests.test_loading import _tiny_tokenizer


def test_every_generation_config_key_is_classified():
    """A transformers upgrade that adds a key fails here until the key is honoured or given a reason."""
    keys = set(GenerationConfig().to_dict())
    assert keys <= HONOURED | set(IGNORED_REASONS), sorted(keys - HONOURED - set(IGNORED_REASONS))
    assert not HONOURED & set(IGNORED_REASONS)
    assert HONOURED <= set(GenerationFields.model_fields), "every honoured key is a request field too"


def test_a_models_file_splits_into_defaults_and_reasons(caplog):
    config = GenerationConfig(
        temperature=0.6, do_sample=True, sequence_bias={(5, 6): -1.0}, exponential_decay_length_penalty=(4, 1.1),
        stop_strings="###", max_length=4096, num_beams=4, token_healing=True, max_new_tokens=64,
    )  # fmt: skip
    honoured, ignored = split_generation_defaults(config.to_diff_dict())
    assert honoured["temperature"] == 0.6 and honoured["do_sample"] is True and honoured["max_new_tokens"] == 64
    assert honoured["sequence_bias"] == [[[5, 6], -1.0]]  # the request's JSON form
    assert honoured["exponential_decay_length_penalty"] == (4, 1.1) and honoured["stop_strings"] == ["###"]
    assert set(ignored) >= {"max_length", "num_beams", "token_healing"}
    assert "strategy" in ignored["num_beams"] and "not supported" in ignored["token_healing"]
    assert split_generation_defaults({"made_up_key": 1})[1] == {"made_up_key": "not a GenerationConfig knob this "
                                                                               "server knows"}  # fmt: skip
    with caplog.at_level(logging.INFO, logger="decoding.params.model_defaults"):
        log_generation_defaults("m", honoured, ignored)
    lines = [r.getMessage() for r in caplog.records]
    assert any("defaults used" in line and "temperature" in line for line in lines)
    assert any("max_length not used: a total-length default" in line for line in lines)


@pytest.fixture
def tiny_llama_folder(tmp_path):  # noqa: ANN201
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         eos_token_id=2)  # fmt: skip
    model = LlamaForCausalLM(config)
    model.generation_config.temperature = 0.7
    model.generation_config.top_p = 0.9
    model.generation_config.do_sample = True
    folder = tmp_path / "tiny-llama"
    model.save_pretrained(folder)
    _tiny_tokenizer().save_pretrained(folder)
    return folder


def test_load_model_keeps_the_honoured_keys_and_logs_the_rest(tiny_llama_folder, caplog):
    import json

    from decoding.model.loading import load_model

    path = tiny_llama_folder / "generation_config.json"
    values = json.loads(path.read_text())
    values.update(sequence_bias=[[[5], 1.5]], renormalize_logits=True, num_beams=3, max_length=50)
    path.write_text(json.dumps(values))
    with caplog.at_level(logging.INFO, logger="decoding.params.model_defaults"):
        loaded = load_model(str(tiny_llama_folder))
    assert loaded.generation_defaults == {"do_sample": True, "temperature": 0.7, "top_p": 0.9,
                                          "sequence_bias": [[[5], 1.5]], "renormalize_logits": True}  # fmt: skip
    lines = [r.getMessage() for r in caplog.records]
    assert any("tiny-llama: generation_config.json num_beams not used: selects a decoding strategy" in x for x in lines)
    assert any("generation_config.json max_length not used" in line for line in lines)
