"""Where a transformers decoder keeps its layer stack and its final norm, whatever the family calls them.

Llama-style models hold ``model.layers`` and ``model.norm``; GPT-2 and Falcon ``transformer.h`` and
``ln_f``; GPT-NeoX ``layers`` and ``final_layer_norm``. The runner hooks them (hidden states for
contrastive search and DoLa, early exit) and ``--compile`` compiles the layers, so both find them
by shape rather than by name: the stack is the decoder's one ``ModuleList`` as long as the
config's ``num_hidden_layers``, the final norm the last normalisation module registered directly
on the decoder after it. GIT's stack is ``git.encoder.layer``, with no final norm (each layer ends in
its own LayerNorm).
"""

from __future__ import annotations

import torch

from decoding.model.seq2seq import decoder_layer_stack, is_encoder_decoder
from decoding.vision.git_prompt import is_git


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder's layer stack, in order."""
    if is_encoder_decoder(model.config):  # the config's layer count is the encoder's
        return decoder_layer_stack(model)
    if is_git(model.config):
        return model.git.encoder.layer
    decoder = model.get_decoder()
    count = model.config.get_text_config().num_hidden_layers
    stacks = [child for child in decoder.children() if isinstance(child, torch.nn.ModuleList) and len(child) == count]
    if len(stacks) != 1:
        raise ValueError(f"{type(decoder).__name__} has no single stack of {count} decoder layers")
    return stacks[0]


def final_norm(model: torch.nn.Module) -> torch.nn.Module:
    """The normalisation the decoder applies to the last layer's output (HF's last hidden state)."""
    decoder = model.get_decoder()
    if is_encoder_decoder(model.config):  # Whisper's and mBART's ``layer_norm``; Bart's and Marian's: none
        norm = getattr(decoder, "layer_norm", None)
        return norm if norm is not None else torch.nn.Identity()
    if is_git(model.config):
        return torch.nn.Identity()
    layers = decoder_layers(model)
    after = False
    norm = None
    for child in decoder.children():
        if child is layers:
            after = True
        elif after and "norm" in type(child).__name__.lower():
            norm = child
    if norm is None:
        raise ValueError(f"{type(decoder).__name__} has no final norm after its decoder layers")
    return norm
