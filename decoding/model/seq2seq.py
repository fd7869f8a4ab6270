"""Encoder-decoder models (Bart, Marian, Whisper) as Decoda runs them: the encoder once per request, the
decoder as one more row of the packed batch.

The decoder is a causal stack like any decoder-only model, plus one cross-attention per layer whose keys
and values come from the encoder's output. Those keys and values never change over a request's life, so
they are computed once, right after the encoder ran, and written into the paged pool under a slot of
their own (the request's *cross slot*): they count in the KV budget, are swapped out with the request when
it is preempted and freed with it. Every row of the request (beams, ``n`` samples) reads the same cross
slot; the attention function tells a cross-attention call from a self-attention one by a mark this module
puts on the cross-attention modules (``CROSS_LAYER``), and reads the cross slot instead of the keys and
values the module computed (the runner hands the decoder a one-position stand-in for the encoder output,
so those cost nothing).

The encoder runs with transformers' own SDPA attention (bidirectional, with the padding mask of a
batch of different lengths); only the decoder's attention is Decoda's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

CROSS_LAYER = "decoda_cross_layer"  # on a cross-attention module: its decoder layer's index
RELATIVE_BIAS = "decoda_relative_bias"  # on T5's decoder self-attention: the module holding the bias table


@dataclass
class EncoderInput:
    """What a request feeds the encoder: token ids (Bart, Marian: the prompt), or Whisper's log-mel
    features ``[num_mel_bins, frames]``."""

    token_ids: list[int] | None = None
    features: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if (self.token_ids is None) == (self.features is None):
            raise ValueError("an encoder input is token ids or features, not both or neither")


def is_encoder_decoder(config: Any) -> bool:
    return bool(getattr(config, "is_encoder_decoder", False))


def decoder_start_ids(model: torch.nn.Module) -> list[int]:
    """The decoder prompt ``generate()`` starts a text request from: its decoder start token."""
    start = getattr(model.generation_config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(model.config, "decoder_start_token_id", None)
    if start is None:
        raise ValueError(f"{type(model).__name__} names no decoder_start_token_id")
    return [start] if isinstance(start, int) else list(start)


def model_task(model: torch.nn.Module) -> str:
    """What ``/v1/models`` says the model does, by HF's pipeline task names."""
    if not is_encoder_decoder(model.config):
        return "text-generation"
    return "automatic-speech-recognition" if getattr(model.config, "num_mel_bins", None) else "text2text-generation"


def seq2seq_facts(model: torch.nn.Module) -> dict[str, Any]:
    """``ModelFacts``' encoder-decoder fields for ``model`` (none for a decoder-only model)."""
    if not is_encoder_decoder(model.config):
        return {}
    takes_audio = bool(getattr(model.config, "num_mel_bins", None))
    return {"encoder_decoder": True, "input_kind": "audio" if takes_audio else "text",
            "max_encoder_len": None if takes_audio else max_encoder_positions(model.config),
            "decoder_prompt_len": len(decoder_start_ids(model))}  # fmt: skip


# T5 has no position table (its positions are a relative bias): its configs' n_positions, 512, bounds it
RELATIVE_POSITIONS_DEFAULT = 512


def max_decoder_positions(config: Any) -> int | None:
    """The longest decoder sequence the model has positions for (Whisper's 448; T5's ``n_positions``)."""
    return (getattr(config, "max_target_positions", None) or getattr(config, "max_position_embeddings", None)
            or getattr(config, "n_positions", None) or RELATIVE_POSITIONS_DEFAULT)  # fmt: skip


def max_encoder_positions(config: Any) -> int | None:
    """The longest encoder input in tokens (Bart's 1024) or frames after the convolutions (Whisper's 1500)."""
    return (getattr(config, "max_source_positions", None) or getattr(config, "max_position_embeddings", None)
            or getattr(config, "n_positions", None) or RELATIVE_POSITIONS_DEFAULT)  # fmt: skip


def cross_attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Each decoder layer's cross-attention, in order: Bart's, Marian's and Whisper's ``encoder_attn``,
    T5's ``EncDecAttention`` (its block's second sub-layer); a family with neither is not served."""
    modules = [_cross_of(layer) for layer in decoder_layer_stack(model)]
    if any(module is None for module in modules):
        raise ValueError(f"{type(model).__name__}'s decoder layers have no encoder_attn (or T5's EncDecAttention) "
                         "with key and value projections")  # fmt: skip
    return modules


def _cross_of(layer: torch.nn.Module) -> torch.nn.Module | None:
    module = getattr(layer, "encoder_attn", None)
    if module is None:  # T5: block.layer = [self-attention, cross-attention, feed-forward]
        sublayers = getattr(layer, "layer", None) or []
        module = getattr(sublayers[1], "EncDecAttention", None) if len(sublayers) > 1 else None
    if module is None or not (hasattr(module, "k_proj") or hasattr(module, "k")):
        return None
    return module


def decoder_layer_stack(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder's layer stack: ``decoder.layers`` (Bart, Marian, Whisper) or ``decoder.block`` (T5)."""
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None)
    if layers is None:
        layers = getattr(decoder, "block", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"{type(decoder).__name__} has no layer stack named layers or block")
    return layers


def mark_cross_attention(model: torch.nn.Module) -> None:
    """Tag every cross-attention module with its layer index, for the attention function, and make the
    decoder's position embedding take each packed token's own position (``PackedPositions``)."""
    for index, module in enumerate(cross_attention_modules(model)):
        setattr(module, CROSS_LAYER, index)
    decoder = model.get_decoder()
    mark_relative_bias(model)
    if not hasattr(decoder, POSITIONS) and hasattr(decoder, "embed_positions"):
        positions = PackedPositions()
        decoder.embed_positions.register_forward_pre_hook(positions.hook, with_kwargs=True)
        setattr(decoder, POSITIONS, positions)


def mark_relative_bias(model: torch.nn.Module) -> None:
    """T5: point every decoder self-attention at the first layer's, which holds the relative position
    bias table all layers share (the attention function computes each packed row's bias from it)."""
    layers = decoder_layer_stack(model)
    first = getattr(getattr(layers[0], "layer", [None])[0], "SelfAttention", None)
    if first is None or not getattr(first, "has_relative_attention_bias", False):
        return
    for layer in layers:  # a plain reference, not a registered submodule (it would own its own owner)
        object.__setattr__(layer.layer[0].SelfAttention, RELATIVE_BIAS, first)


class PackedPositions:
    """The position ids the decoder's position embedding is called with during a packed forward.

    Bart's and Marian's decoders number their input ``0..n-1`` after the cache's length and ignore the
    ``position_ids`` they are given; packed rows each start at their own position. All three families
    call their embedding with a ``position_ids`` keyword, which this hook replaces with the rows' own.
    """

    def __init__(self) -> None:
        self.current: torch.Tensor | None = None  # [num_tokens]

    def hook(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if self.current is not None:
            kwargs = {**kwargs, "position_ids": self.current}
        return args, kwargs


POSITIONS = "decoda_packed_positions"


@contextmanager
def attention_implementation(model: torch.nn.Module, name: str) -> Iterator[None]:
    """Run with transformers' attention ``name`` (the encoder's SDPA); the config is shared with the
    decoder, and the worker is the only thread that runs the model, so switching it for a call is safe."""
    configs = {id(module.config): module.config for module in model.modules() if hasattr(module, "config")}
    saved = {key: config._attn_implementation for key, config in configs.items()}
    for config in configs.values():
        config._attn_implementation = name
    try:
        yield
    finally:
        for key, config in configs.items():
            config._attn_implementation = saved[key]


def encoder_length(model: torch.nn.Module, encoder_input: EncoderInput) -> int:
    """Positions the encoder's output has for this input: its tokens, or Whisper's frames after the
    stride-2 convolution."""
    if encoder_input.token_ids is not None:
        return len(encoder_input.token_ids)
    frames = encoder_input.features.shape[-1]
    conv = getattr(model.get_encoder(), "conv2", None)
    stride = conv.stride[0] if conv is not None else 1
    return (frames - 1) // stride + 1


@torch.inference_mode()
def encode(model: torch.nn.Module, inputs: list[EncoderInput], device: torch.device) -> list[torch.Tensor]:
    """The encoder's output for each input (``[length, d_model]``), those of one kind in one batch."""
    outputs: list[torch.Tensor | None] = [None] * len(inputs)
    encoder = model.get_encoder()
    dtype = next(model.parameters()).dtype
    with attention_implementation(model, "sdpa"):
        texts = [i for i, item in enumerate(inputs) if item.token_ids is not None]
        if texts:
            longest = max(len(inputs[i].token_ids) for i in texts)
            pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
            ids = torch.full((len(texts), longest), pad, dtype=torch.long, device=device)
            mask = torch.zeros((len(texts), longest), dtype=torch.long, device=device)
            for row, i in enumerate(texts):
                tokens = inputs[i].token_ids
                ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long, device=device)
                mask[row, : len(tokens)] = 1
            hidden = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
            for row, i in enumerate(texts):
                outputs[i] = hidden[row, : len(inputs[i].token_ids)]
        audio = [i for i, item in enumerate(inputs) if item.features is not None]
        if audio:
            features = torch.stack([inputs[i].features for i in audio]).to(device=device, dtype=dtype)
            hidden = encoder(input_features=features).last_hidden_state
            for row, i in enumerate(audio):
                outputs[i] = hidden[row]
    return outputs


def cross_keys_values(module: torch.nn.Module, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's cross-attention keys and values for an encoder output ``[length, d_model]``, as the
    module computes them: ``[heads, length, head_dim]`` each."""
    length = hidden.shape[0]
    head_dim = getattr(module, "head_dim", None) or module.key_value_proj_dim  # T5's d_kv
    shape = (1, length, -1, head_dim)
    key_proj, value_proj = (module.k_proj, module.v_proj) if hasattr(module, "k_proj") else (module.k, module.v)
    keys = key_proj(hidden[None]).view(shape).transpose(1, 2)[0]
    values = value_proj(hidden[None]).view(shape).transpose(1, 2)[0]
    return keys, values


def decoder_logits(
    model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, keep: torch.Tensor, **kwargs: Any
) -> torch.Tensor:
    """The decoder's logits ``[1, kept, vocab]`` at the packed positions ``keep``: the stack with a
    one-position stand-in for the encoder output (cross-attention reads the cross slot), then the head
    on the kept positions only, with the bias Bart and Marian add."""
    decoder = model.get_decoder()
    stand_in = torch.zeros((1, 1, model.config.d_model), dtype=next(model.parameters()).dtype, device=input_ids.device)
    positions: PackedPositions | None = getattr(decoder, POSITIONS, None)
    if positions is not None:  # Bart, Marian, Whisper; T5's positions are its attention's relative bias
        positions.current = position_ids[0]
        kwargs = {**kwargs, "position_ids": position_ids}
    try:
        hidden = decoder(input_ids=input_ids, encoder_hidden_states=stand_in, use_cache=False,
                         **kwargs).last_hidden_state  # fmt: skip
    finally:
        if positions is not None:
            positions.current = None
    hidden = hidden[:, keep]
    if hasattr(model, "model_dim") and model.config.tie_word_embeddings:  # T5 rescales before its tied head
        hidden = hidden * (model.model_dim**-0.5)
    logits = model.get_output_embeddings()(hidden)
    bias = getattr(model, "final_logits_bias", None)
    return logits + bias if bias is not None else logits
