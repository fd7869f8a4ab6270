"""``--compile``: each decoder layer is compiled on its own, and all layers share one graph.

Compiling the whole forward traces every layer into one graph: minutes on a small CPU for each
shape the compiler specializes on, paid again by the first request of a new shape. The layers of
a decoder are one class run over and over, so compiling the layer instead (PyTorch's "regional
compilation") traces one layer and reuses that graph for all of them: their weights reach the
graph as inputs (parameters and buffers, which is why the low-bit matrices keep theirs as
buffers), and the layer index the attention reads is left symbolic rather than a constant per
layer. What stays eager is the thin part around the layers: the embedding lookup, the final norm
and the LM head on the rows kept.

The step layout cannot travel as an argument into compiled code (a new Python object each step
would re-trace), so a compiled model gets it beside the call (``attention.active_layout``); the
runner asks ``is_compiled``. Compiling before serving (driving the engine once per shape) is the
engine's start-up business: ``decoding.engine.warmup``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch._dynamo

from decoding.model.anatomy import decoder_layers

COMPILED_MARK = "_decoda_compiled_layers"


def compile_layers(model: torch.nn.Module, backend: str | Callable = "inductor") -> int:
    """Compile each decoder layer in place (dynamic shapes); returns how many."""
    torch._dynamo.config.allow_unspec_int_on_nn_module = True  # layer_idx: one graph, not one per layer
    layers = decoder_layers(model)
    for layer in layers:  # the forward, not the module call: hooks (DoLa's capture, early exit) stay eager
        layer.forward = torch.compile(layer.forward, dynamic=True, backend=backend)
    setattr(model, COMPILED_MARK, True)
    return len(layers)


def is_compiled(model: torch.nn.Module) -> bool:
    """True when the model's layers (or its whole forward) run compiled."""
    return bool(getattr(model, COMPILED_MARK, False)) or hasattr(model.forward, "_torchdynamo_orig_callable")
