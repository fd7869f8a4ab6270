"""``--compile`` compiles the whole forward, each decoder layer a nested region (``decoding.model.compile``).

What it promises: the layers share one traced subgraph (not one per layer: that is what makes the
compile take one layer's time), quantized layers included (their matrices reach the graph as
buffers, the layer index as a tensor); every strategy gives the tokens it gives eagerly, the ones
that hook into layers (DoLa's and contrastive search's hidden states, early exit) included, since
those forwards run eagerly; and the warm-up the server runs before it serves leaves no compile to
a request, with guard checks trimmed afterwards. The compiler's backend here is a counting
pass-through, so the test measures tracing, not codegen.
"""

from __future__ import annotations

import copy
import random
import types

import pytest
import torch

import tests.engine_harness as engine_harness
from decoding.engine.warmup import warm_up
from decoding.kv.paged_attention import native_available
from decoding.model.attention import register_attention
from decoding.model.compile import compile_model
from decoding.model.quantization import quantize_model
from decoding.params import GenerationParams
from tests.engine_harness import EngineHarness, tiny_llama
from tests.test_custom_generate import LOOKAHEAD, harness_with, hf_custom
from tests.test_kv_paged import STRATEGIES

EOS = 2
VOCAB = 64
NUM_LAYERS = 4


def prompt(seed: int, length: int = 20) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(length)]


def run_all(harness: EngineHarness) -> dict[str, list[list[int]]]:
    """Every strategy, all in one batch, then greedy alone (single-token steps)."""
    for name, params in STRATEGIES.items():
        harness.add(name, prompt(len(name)), params)
    harness.run()
    harness.add("alone", prompt(1), GenerationParams(max_new_tokens=8))
    harness.run()
    return {
        name: [harness.token_ids(name, i) for i in range(STRATEGIES[name].n if name in STRATEGIES else 1)]
        for name in [*STRATEGIES, "alone"]
    }


def serve_compiled(monkeypatch: pytest.MonkeyPatch) -> list[torch.fx.GraphModule]:
    """Make EngineHarness serve its model compiled; returns the graphs compiled so far."""
    graphs: list[torch.fx.GraphModule] = []

    def counting_backend(graph: torch.fx.GraphModule, example_inputs: list) -> object:  # noqa: ARG001
        graphs.append(graph)
        return graph.forward

    def served(original: torch.nn.Module) -> torch.nn.Module:
        ours = copy.deepcopy(original)
        ours.set_attn_implementation(register_attention())
        compile_model(ours, backend=counting_backend)
        return ours

    torch._dynamo.reset()
    monkeypatch.setattr(engine_harness, "as_served", served)
    return graphs


@pytest.fixture
def default_stance():
    yield
    torch.compiler.set_stance("default")  # warm_up trims guard checks process-wide
    torch._dynamo.reset()


@pytest.mark.parametrize("quantization", ["none", "int4"])
def test_compiled_layers_share_graphs_and_every_strategy_keeps_its_tokens(
    quantization, smollm2_tokenizer, monkeypatch, default_stance
):
    model = tiny_llama(VOCAB, seed=5, num_layers=NUM_LAYERS)
    quantize_model(model, quantization)
    expected = run_all(EngineHarness(model, smollm2_tokenizer, [EOS]))
    graphs = serve_compiled(monkeypatch)
    harness = EngineHarness(model, smollm2_tokenizer, [EOS])
    assert harness.engine.runner.compiled  # the layout then travels beside the call
    warm_up(harness.engine, prompt(9))
    compiled_before_serving = len(graphs)
    assert run_all(harness) == expected
    assert len(graphs) == 2, f"{len(graphs)} graphs"  # one per shape class: one token a step, more
    assert len(graphs) == compiled_before_serving  # the warm-up left no compile to a request
    for graph in graphs:  # every layer calls the one subgraph traced for the first
        assert layer_subgraphs(graph) == [layer_subgraphs(graph)[0]] * NUM_LAYERS
    # the one-token graph's layers call the native operator, the many-token graph's the Python custom op
    if native_available():
        calls = sorted(attention_calls(graph) for graph in graphs)
        assert calls == [["decoda.packed_attention"], ["decoda_paged.step_attention"]]


def attention_calls(graph: torch.fx.GraphModule) -> list[str]:
    """The attention operators the layers' shared subgraph calls."""
    subgraph = getattr(graph, layer_subgraphs(graph)[0])
    targets = [str(node.target) for node in subgraph.graph.nodes if node.op == "call_function"]
    return [target.removesuffix(".default") for target in targets if "attention" in target]


def layer_subgraphs(graph: torch.fx.GraphModule) -> list[str]:
    """The subgraph each ``invoke_subgraph`` call of ``graph`` runs, in call order."""
    calls = [node for node in graph.graph.nodes if node.op == "call_function" and "invoke_subgraph" in str(node.target)]
    return [str(call.args[0].target) for call in calls]


def test_a_custom_method_runs_its_own_forwards_beside_compiled_layers(smollm2_tokenizer, monkeypatch, default_stance):
    """A custom ``generate()`` calls the model with transformers' attention; the compiled graphs (traced
    with the engine's, guards trimmed) must not serve it, so it runs the layers eagerly."""
    model = tiny_llama(len(smollm2_tokenizer), seed=1)
    prompt_ids = [5, 17, 300, 4000, 12]
    expected = hf_custom(model, LOOKAHEAD, prompt_ids, 8, [EOS])
    serve_compiled(monkeypatch)
    harness = harness_with(model, smollm2_tokenizer, [EOS])
    warm_up(harness.engine, prompt(9))
    harness.add("look", prompt_ids, GenerationParams(max_new_tokens=8, custom_generate="lookahead"))
    harness.run()
    assert harness.token_ids("look") == expected


class _Block(torch.nn.Module):
    """A layer called the way transformers calls its decoder layers: keyword arguments, a tuple among them."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(8, generator=torch.Generator().manual_seed(seed)))

    def forward(self, hidden, *, pair=None, flag=False, extra=None):  # noqa: ANN001, ANN201
        cos, sin = pair
        out = hidden * self.scale * cos + sin
        if flag:
            out = out + 1.0
        if extra is not None:
            out = out * extra["gain"]
        return out


@pytest.mark.parametrize("extra", [None, {"gain": 2.0}], ids=["flat", "keywords"])
def test_layers_with_keyword_arguments_share_one_subgraph(extra, default_stance) -> None:
    """Keyword arguments and tuples reach the nested region flattened (dynamo's fast path); what cannot
    be flattened (a dict) goes the keyword way. Either way the layers share one traced subgraph."""
    from decoding.model.compile import _flat_region

    layers = torch.nn.ModuleList(_Block(seed) for seed in range(3))
    region = _flat_region(_Block, max_reuse_entries=8)
    for layer in layers:
        layer.forward = types.MethodType(region, layer)

    def run(hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        for layer in layers:
            hidden = layer(hidden, pair=(cos, sin), flag=True, extra=extra)
        return hidden

    graphs: list[torch.fx.GraphModule] = []

    def counting_backend(graph: torch.fx.GraphModule, example_inputs: list) -> object:  # noqa: ARG001
        graphs.append(graph)
        return graph.forward

    torch._dynamo.reset()
    inputs = (torch.randn(2, 8), torch.randn(8), torch.randn(8))
    expected = run(*inputs)
    assert torch.allclose(torch.compile(run, backend=counting_backend, fullgraph=True)(*inputs), expected)
    assert len(graphs) == 1
    # one subgraph, called again for the later layers (dynamo inlines this toy's first call)
    calls = layer_subgraphs(graphs[0])
    assert len(calls) >= 2 and len(set(calls)) == 1, calls
