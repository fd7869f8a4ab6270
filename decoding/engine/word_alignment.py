"""The alignment heads' cross-attention scores of a Whisper window's text, for its word timestamps.

Word timing (``decoding/text/word_timing.py``) needs, for each of the model's ``alignment_heads``
(decoder layer, head), how every token of the window's text attends over the window's audio. The engine's
forward never materializes attention weights (its paged attention computes them inside one kernel, and
the request's cross-attention keys are freed with it), so the text is run once more here, teacher-forced,
through transformers' own forward of the model (encoder included: its output is not kept after a window's
request), with a hook on each alignment layer's cross-attention that computes those heads' scores from the
query and key projections as the layer does (``q_proj(h) * scaling`` against ``k_proj(encoder output)``).

It runs on the worker thread between two steps (``Worker.call``): that thread is the only one that runs the
model, which keeps switching the attention implementation for the call safe. Its cost, an encoder and a
decoder pass per window, is paid only by requests that ask for word timestamps.
"""

from __future__ import annotations

import numpy as np
import torch

from decoding.model.seq2seq import attention_implementation, cross_attention_modules


def alignment_heads(model: torch.nn.Module) -> list[tuple[int, int]]:
    """The (decoder layer, head) pairs whose cross-attention follows the speech: the generation config's
    ``alignment_heads``, else openai-whisper's default, every head of the decoder's second half."""
    heads = getattr(model.generation_config, "alignment_heads", None)
    if heads:
        return [(int(layer), int(head)) for layer, head in heads]
    layers, per_layer = model.config.decoder_layers, model.config.decoder_attention_heads
    return [(layer, head) for layer in range(layers // 2, layers) for head in range(per_layer)]


@torch.inference_mode()
def alignment_scores(model: torch.nn.Module, features: torch.Tensor, tokens: list[int]) -> np.ndarray:
    """``[alignment heads, len(tokens), encoder positions]``: each head's query·key scores (scaled, before the
    softmax) of ``tokens`` (the teacher-forced decoder input) over the encoder's output for ``features``
    (one window's log-mel ``[mel bins, frames]``)."""
    heads = alignment_heads(model)
    modules = cross_attention_modules(model)
    wanted: dict[int, list[int]] = {}
    for layer, head in heads:
        wanted.setdefault(layer, []).append(head)
    scores: dict[tuple[int, int], torch.Tensor] = {}

    def capture(layer: int):
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            encoded = kwargs.get("key_value_states")
            if encoded is None and len(args) > 1:
                encoded = args[1]
            size = module.head_dim
            query = (module.q_proj(hidden) * module.scaling)[0].view(hidden.shape[1], -1, size)
            key = module.k_proj(encoded)[0].view(encoded.shape[1], -1, size)
            for head in wanted[layer]:
                scores[(layer, head)] = (query[:, head].float() @ key[:, head].float().T).cpu()

        return hook

    hooks = [modules[layer].register_forward_pre_hook(capture(layer), with_kwargs=True) for layer in wanted]
    parameter = next(model.parameters())
    try:
        with attention_implementation(model, "sdpa"):
            model(input_features=features[None].to(device=parameter.device, dtype=parameter.dtype),
                  decoder_input_ids=torch.tensor([tokens], device=parameter.device), use_cache=False)  # fmt: skip
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack([scores[pair] for pair in heads]).numpy()
