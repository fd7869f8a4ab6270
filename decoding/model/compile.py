"""``--compile``: the whole forward is one compiled graph, each decoder layer traced once.

A step's Python cost must not grow with the layer count. Compiling each layer on its own (PyTorch's
"regional compilation", what ``--compile`` did first) leaves one compiled-region call a layer: its
guard check and wrappers took ~2.5 ms of a ~14.5 ms one-row step of SmolLM2's 30 layers. Compiling
the whole forward as it is traces every layer into the graph: over 13 minutes on 2 cores. So the
forward is compiled whole, with each layer a *nested compile region*
(``torch.compiler.nested_compile_region``): dynamo traces the first layer, stamps the same subgraph
out for the others, and inductor compiles it once. Measured on SmolLM2 gguf, one row, processes
taking turns: 12.5-13.5 ms a step against 14.5-15.2 ms for the per-layer graphs (1.14x). The
graph keeps no guards on the modules (``skip_guard_on_all_nn_modules_unsafe``): the weights and
attributes of a served model never change, and checking its ~500 tensors every step was ~2.2 ms of
dynamo's cache lookup (0.06 ms without; steps 1.05-1.27x faster in turns). Forwards that would
differ (hooks, another attention implementation) run eagerly. Without those guards a second model
of the same class compiled in the same process could reuse this one's graphs: the server compiles
one model per process, and a process that compiles another calls ``torch._dynamo.reset()`` first
(the tests and ``loadtests/bench_step.py`` do).

Two things keep the layers alike for the stamp: a layer's weights reach the subgraph as inputs
(parameters and buffers, which is why the low-bit matrices keep theirs as buffers), and the layer
index the attention reads travels as a 0-d tensor buffer (``LAYER_BUFFER``) instead of the module's
Python int, which dynamo would bake into each layer's subgraph as a different constant. Layers that
do differ (Gemma's local and global attention) get one subgraph each.

The number of new tokens and of kept logits are dynamic from two up (the forward keeps a lone kept
logit twice and returns it once, so a prompt with one kept logit needs no graph of its own: a cold
start compiles two graphs in ~34 s instead of three in ~47); one token, a lone decode step, gets a
graph of its own, specialized: the one-user step is the one to make fast. Its layers call the
native paged-attention operator directly (``paged_attention.step_attention``: ~26 us a layer where
the Python custom op took ~70), and the generated wrapper keeps no size, stride or alignment
asserts (``size_asserts``, ``alignment_asserts``: ~1,100 Python checks, ~0.9 ms of a ~12 ms one-row
step in torch.profiler; the graph's inputs are the served model's own tensors, and dynamo's guards
still check the step's). The step layout cannot travel as an argument into compiled code (a new
Python object each step would re-trace), so a compiled model gets it beside the call
(``attention.active_layout``); the runner asks
``is_compiled``, and runs eagerly the forwards that hook into layers (captured hidden states, early
exit). Compiling before serving (driving the engine once per shape) is the engine's start-up
business: ``decoding.engine.warmup``.
"""

from __future__ import annotations

import functools
import itertools
import types
from collections.abc import Callable

import torch
import torch._dynamo

from decoding.model.anatomy import decoder_layers
from decoding.model.inductor_cache import use_private_inductor_cache

COMPILED_MARK = "_decoda_compiled"
LAYER_BUFFER = "_decoda_layer"  # the attention module's layer index as a 0-d int64 tensor
_TOKEN_DIMS = (("input_ids", 1), ("position_ids", 1), ("logits_to_keep", 0))


def compile_model(model: torch.nn.Module, backend: str | Callable = "inductor") -> int:
    """Compile ``model.forward`` in place, each decoder layer a nested region; returns the layer count."""
    layers = decoder_layers(model)
    regions: dict[type, Callable] = {}
    for layer in layers:
        number_attention(layer)
        kind = type(layer)
        if kind not in regions:  # one region per layer class: its layers share the traced subgraph
            regions[kind] = _flat_region(kind, max_reuse_entries=max(8, len(layers)))
        layer.forward = types.MethodType(regions[kind], layer)
    if backend == "inductor":
        use_private_inductor_cache()  # its kernels are native code loaded from its cache: a private one
        _int4_kernel_as_a_plain_call()
    # no guards on the modules: their weights and attributes never change while serving, and checking
    # the ~500 tensors of a small model took ~2.2 ms of a one-row step (dynamo's cache lookup)
    options: dict[str, object] = {"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe}
    if backend == "inductor":  # no Python size/stride/alignment checks in the generated wrapper
        options |= {"size_asserts": False, "alignment_asserts": False}
    compiled = torch.compile(model.forward, dynamic=None, backend=backend, options=options)

    @functools.wraps(model.forward)
    def forward(*args: object, **kwargs: object) -> object:
        keep = kwargs.get("logits_to_keep")
        lone = isinstance(keep, torch.Tensor) and keep.shape == (1,)
        if lone:  # one kept logit would be a graph of its own: keep it twice, return it once
            kwargs["logits_to_keep"] = keep.repeat(2)
        for name, dim in _TOKEN_DIMS:
            tensor = kwargs.get(name)
            if isinstance(tensor, torch.Tensor) and tensor.dim() > dim and tensor.shape[dim] > 1:
                torch._dynamo.maybe_mark_dynamic(tensor, dim)
        output = compiled(*args, **kwargs)
        if lone:
            output.logits = output.logits[:, :1]
        return output

    model.forward = forward
    setattr(model, COMPILED_MARK, True)
    return len(layers)


_LEAF_TYPES = (torch.Tensor, type(None), bool, int, float, str)


def _flat_region(kind: type, max_reuse_entries: int) -> Callable:
    """``kind.forward`` as a nested region that dynamo finds by a flat list of leaves.

    Before reusing a traced layer, dynamo fingerprints the call's inputs; keyword arguments or a
    tuple among them (every transformers decoder passes ``position_embeddings=(cos, sin)`` by
    keyword) send it through a traced ``pytree.tree_flatten``, ~36 ms a layer: a third of the
    tracing. Positional leaves (tensors, constants, the module) take its fast path. So the layer's
    keyword arguments, with tuples opened one level, travel flattened, each name and length a
    constant beside its values, and the region puts them back together before calling the layer.
    Anything else (a cache object, a nested structure) is passed as it came, the slow way."""

    def rebuild(layer: torch.nn.Module, num_args: int, *flat: object) -> object:
        args, rest, kwargs = flat[:num_args], flat[num_args:], {}
        i = 0
        while i < len(rest):
            name, length = rest[i], rest[i + 1]
            if length < 0:
                kwargs[name] = rest[i + 2]
                i += 3
            else:
                kwargs[name] = tuple(rest[i + 2 : i + 2 + length])
                i += 2 + length
        return kind.forward(layer, *args, **kwargs)

    # a code object of its own per layer class: dynamo keeps a region's traced layers by its code
    rebuild.__code__ = rebuild.__code__.replace(co_name=f"{kind.__name__}_region")
    flat_region = torch.compiler.nested_compile_region(rebuild, max_reuse_entries=max_reuse_entries)
    keyword_region = torch.compiler.nested_compile_region(kind.forward, max_reuse_entries=max_reuse_entries)

    def forward(layer: torch.nn.Module, *args: object, **kwargs: object) -> object:
        if not all(isinstance(arg, _LEAF_TYPES) for arg in args):
            return keyword_region(layer, *args, **kwargs)
        flat: list[object] = [len(args), *args]
        for name, value in kwargs.items():
            if isinstance(value, _LEAF_TYPES):
                flat += [name, -1, value]
            elif isinstance(value, tuple) and all(isinstance(item, _LEAF_TYPES) for item in value):
                flat += [name, len(value), *value]
            else:
                return keyword_region(layer, *args, **kwargs)
        return flat_region(layer, *flat)

    return forward


def number_attention(layer: torch.nn.Module) -> None:
    """Give each attention module in ``layer`` its layer index as a buffer, so it is a graph input."""
    for module in layer.modules():
        index = getattr(module, "layer_idx", None)
        if isinstance(index, int) and not hasattr(module, LAYER_BUFFER):
            weight = next(itertools.chain(layer.parameters(), layer.buffers()), None)
            device = weight.device if weight is not None else torch.device("cpu")
            module.register_buffer(LAYER_BUFFER, torch.tensor(index, device=device), persistent=False)


def _int4_kernel_as_a_plain_call() -> None:
    """Inductor lowers PyTorch's int4 kernel with its group size as a graph constant, which inside a
    nested region's subgraph resolves to another tensor (torch 2.13: "group size must be a scalar",
    Gemma 3's Q6_K weights in bfloat16). Without max-autotune the lowering only calls the same
    kernel, so a plain call to it (inductor's fallback) loses nothing."""
    from torch._inductor import lowering

    lowering.make_fallback(torch.ops.aten._weight_int4pack_mm_for_cpu, warn=False)


def is_compiled(model: torch.nn.Module) -> bool:
    """True when the model's forward runs compiled (by ``compile_model`` or a plain ``torch.compile``)."""
    return bool(getattr(model, COMPILED_MARK, False)) or hasattr(model.forward, "_torchdynamo_orig_callable")
