"""Whisper's encoder residual stream is row-major from its first layer (decoding/model/encoder_layout.py):
the same encoder output up to float reassociation, and models without Whisper's convolutions untouched."""

from __future__ import annotations

import torch

from decoding.model.encoder_layout import keep_encoder_stream_row_major
from tests.test_engine_seq2seq import tiny_bart, tiny_t5, tiny_whisper


def first_layer_input(model: torch.nn.Module, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    seen = []
    hook = model.get_encoder().layers[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    with torch.inference_mode():
        output = model.get_encoder()(input_features=features).last_hidden_state
    hook.remove()
    return seen[0], output


def test_whisper_stream_is_row_major_with_the_same_encoder_output():
    model = tiny_whisper()
    features = torch.randn(2, 8, 60, generator=torch.Generator().manual_seed(0))
    stream, before = first_layer_input(model, features)
    assert not stream.is_contiguous()  # what transformers' permute leaves: the reason for the hook
    assert keep_encoder_stream_row_major(model)
    stream, after = first_layer_input(model, features)
    assert stream.is_contiguous()
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    assert not keep_encoder_stream_row_major(model)  # hooked once


def test_text_encoders_are_left_alone():
    for model in (tiny_bart(), tiny_t5()):
        assert not keep_encoder_stream_row_major(model)
