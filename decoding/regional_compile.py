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
runner asks ``is_compiled``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch._dynamo

if TYPE_CHECKING:
    from decoding.engine import Engine

COMPILED_MARK = "_decoda_compiled_layers"


def compile_layers(model: torch.nn.Module, backend: str | Callable = "inductor") -> int:
    """Compile each decoder layer in place (dynamic shapes); returns how many."""
    torch._dynamo.config.allow_unspec_int_on_nn_module = True  # layer_idx: one graph, not one per layer
    layers = model.get_decoder().layers
    for layer in layers:  # the forward, not the module call: hooks (DoLa's capture, early exit) stay eager
        layer.forward = torch.compile(layer.forward, dynamic=True, backend=backend)
    setattr(model, COMPILED_MARK, True)
    return len(layers)


def is_compiled(model: torch.nn.Module) -> bool:
    """True when the model's layers (or its whole forward) run compiled."""
    return bool(getattr(model, COMPILED_MARK, False)) or hasattr(model.forward, "_torchdynamo_orig_callable")


def warm_up(engine: Engine, prompt_ids: list[int]) -> float:
    """Compile before serving: run the shapes a layer specializes on (many tokens a step, then one).

    A batch of two prompts gives multi-token steps, a lone request one-token steps; the compiler
    keeps a graph for each, so afterwards no request waits for a compile. The observer is muted so
    metrics count only real requests, and prompt plus answer stay shorter than a KV block (16
    tokens by default), so nothing is left in the prefix cache. Returns the seconds it took.
    """
    from decoding.params import GenerationParams
    from decoding.telemetry import EngineObserver

    new_tokens = 3
    prompt = (prompt_ids * engine.pool.block_size)[: max(2, engine.pool.block_size - 1 - new_tokens)]
    observers = engine.ctx.observer, engine.scheduler.observer
    engine.ctx.observer = engine.scheduler.observer = EngineObserver()
    start = time.perf_counter()
    try:
        with torch.inference_mode():
            for batch in (["warm-up-a", "warm-up-b"], ["warm-up-c"]):
                for i, request_id in enumerate(batch):
                    params = GenerationParams(max_new_tokens=new_tokens)
                    engine.add_request(request_id, prompt[: len(prompt) - i], params)
                while engine.has_work():
                    engine.step()
    finally:
        engine.ctx.observer, engine.scheduler.observer = observers
    # Every shape now has its graph, so only the guards that tell the graphs apart need checking:
    # the rest cost ~0.15 ms a layer call, a seventh of a one-row step.
    torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
    return time.perf_counter() - start
