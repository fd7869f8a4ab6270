"""The load-time check of an encoder-decoder model: its decoder through Decoda's paged attention (self-
attention in the pool, cross-attention over a cross slot) gives the logits transformers' own forward gives.

As ``support.check_model`` does for decoder-only models, this catches what no config field says: a
decoder layer without a cross-attention Decoda can read, a position embedding that ignores the packed
positions, attention that bypasses the interface. The probe is a short encoder input (tokens, or
features of the model's mel bins) and a decoder prompt fed as a chunk, then one decode step.
"""

from __future__ import annotations

import torch

from decoding.kv.pool import KVPool
from decoding.model.registry import ModelLoadError
from decoding.model.runner import ModelRunner, RowInput
from decoding.model.seq2seq import (
    EncoderInput,
    cross_attention_modules,
    cross_keys_values,
    encode,
    encoder_length,
    mark_cross_attention,
)

_DECODER_TOKENS = 5
_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 6e-2, torch.float16: 2e-2}


@torch.inference_mode()
def check_seq2seq(model: torch.nn.Module, name: str) -> None:
    """Refuse an encoder-decoder model whose decoder Decoda cannot run as transformers does."""
    try:
        modules = cross_attention_modules(model)
    except ValueError as error:
        raise ModelLoadError(f"architecture {name}: {error}; Decoda reads each decoder layer's cross-attention "
                             "keys and values from its pool and cannot serve this family") from error  # fmt: skip
    mark_cross_attention(model)
    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    probe = _probe_input(model, device)
    decoder_ids = [(5 * i + 3) % vocab for i in range(_DECODER_TOKENS)]
    try:
        ours = _paged_logits(model, modules, probe, decoder_ids, device)
    except Exception as error:
        raise ModelLoadError(f"architecture {name} cannot run on Decoda's paged attention: {error}") from error
    inputs = {"input_ids": torch.tensor([probe.token_ids], device=device)} if probe.token_ids is not None else {
        "input_features": probe.features[None].to(device=device, dtype=next(model.parameters()).dtype)}  # fmt: skip
    saved = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        reference = model(**inputs, decoder_input_ids=torch.tensor([decoder_ids], device=device),
                          use_cache=False).logits[0].float()  # fmt: skip
    finally:
        model.set_attn_implementation(saved)
    scale = reference.abs().max().clamp(min=1e-6)
    error = float((ours - reference).abs().max() / scale)
    if not error <= _TOLERANCE.get(next(model.parameters()).dtype, 1e-3):
        raise ModelLoadError(f"architecture {name} gives different logits through Decoda's paged attention than "
                             f"through transformers' eager attention (relative error {error:.2g})")  # fmt: skip


def _probe_input(model: torch.nn.Module, device: torch.device) -> EncoderInput:
    mel_bins = getattr(model.config, "num_mel_bins", None)
    if mel_bins:
        frames = 2 * model.config.max_source_positions  # Whisper's encoder takes exactly its 30 s window
        generator = torch.Generator(device=device).manual_seed(0)
        return EncoderInput(features=torch.randn(mel_bins, frames, generator=generator, device=device))
    return EncoderInput(token_ids=[(7 * i + 3) % model.config.vocab_size for i in range(9)])


def _paged_logits(model: torch.nn.Module, modules: list, probe: EncoderInput, decoder_ids: list[int],
                  device: torch.device) -> torch.Tensor:  # fmt: skip
    length = encoder_length(model, probe)
    pool = KVPool.for_model(model, num_slots=2, max_model_len=max(length, _DECODER_TOKENS), device=device,
                            block_size=4)  # fmt: skip
    row, cross = pool.allocate(), pool.allocate()
    pool.prepare(cross, 0, length)
    pool.cross_slots[row], pool.cross_lengths[cross] = cross, length
    (states,) = encode(model, [probe], device)
    for layer, module in enumerate(modules):
        pool.write(cross, layer, *cross_keys_values(module, states))
    runner = ModelRunner(model, pool, device)
    first = runner.forward([RowInput(row, 0, decoder_ids[:-1], 0)])[0]
    last = runner.forward([RowInput(row, len(decoder_ids) - 1, decoder_ids[-1:], 0)])[0]
    return torch.cat([first, last])
