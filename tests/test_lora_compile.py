"""``--compile`` with LoRA adapters: steps without an adapter run the compiled graph (traced through the wrapped
projections, which add nothing there), steps with one run eagerly (the runner's ``force_eager``), and neither
recompiles the other; every request keeps the tokens of the eager engine, adapters and base mixed in a batch.
The compiler's backend is a counting pass-through (tracing is what is tested, not codegen)."""

from __future__ import annotations

import copy

import pytest
import torch

from decoding.engine.core import Engine
from decoding.engine.limits import EngineLimits
from decoding.engine.lora import LoraLimits
from decoding.model.attention import register_attention
from decoding.model.compile import compile_model
from tests.engine_harness import EngineHarness, tiny_llama
from tests.test_lora_engine import EOS, GREEDY, SAMPLED, LoraHarness, make_adapter, prompt


class CompiledLoraHarness(EngineHarness):
    def __init__(self, model: torch.nn.Module, tokenizer: object, adapters: dict, graphs: list) -> None:
        self.outputs = {}

        def counting_backend(graph: torch.fx.GraphModule, example_inputs: list) -> object:  # noqa: ARG001
            graphs.append(graph)
            return graph.forward

        ours = copy.deepcopy(model)
        ours.set_attn_implementation(register_attention())
        compile_model(ours, backend=counting_backend)
        self.engine = Engine(ours, tokenizer, [EOS], EngineLimits(256, 32, 512), self._collect, torch.device("cpu"),
                             lora=LoraLimits(4, 16))  # fmt: skip
        assert self.engine.runner.compiled
        for name, path in adapters.items():
            self.engine.loras.load(name, str(path))


@pytest.fixture
def default_stance():
    torch._dynamo.reset()
    yield
    torch.compiler.set_stance("default")
    torch._dynamo.reset()


def run(harness: EngineHarness) -> dict[str, list[int]]:
    requests = {
        "base-alone": (prompt(1), GREEDY, None),
        "a-alone": (prompt(2), GREEDY, "a"),
    }
    for name, (ids, params, adapter) in requests.items():  # one at a time: one-row steps, each path alone
        harness.add(name, ids, params.replace(lora_name=adapter))
        harness.run()
    mixed = {f"{adapter or 'base'}-{label}": (prompt(10 + i), params, adapter)
             for i, (adapter, (label, params)) in enumerate(
                 (a, p) for a in (None, "a", "b") for p in (("greedy", GREEDY), ("sampled", SAMPLED)))}  # fmt: skip
    for name, (ids, params, adapter) in mixed.items():
        harness.add(name, ids, params.replace(lora_name=adapter))
    harness.run()
    harness.add("base-after", prompt(1), GREEDY)  # the compiled graph again, after the adapters' eager steps
    harness.run()
    return {name: harness.token_ids(name) for name in [*requests, *mixed, "base-after"]}


def test_adapters_under_compile_keep_the_eager_engines_tokens(smollm2_tokenizer, tmp_path, default_stance):
    model = tiny_llama(500, seed=7)
    folders = {"a": tmp_path / "a", "b": tmp_path / "b"}
    make_adapter(model, folders["a"], seed=1)
    make_adapter(model, folders["b"], seed=2, r=8, targets=["q_proj", "v_proj", "down_proj"])
    expected = run(LoraHarness(model, smollm2_tokenizer, folders))
    graphs: list = []
    harness = CompiledLoraHarness(model, smollm2_tokenizer, folders, graphs)
    harness.add("warm", prompt(3), GREEDY)  # compiles the prefill's and the one-token step's graphs
    harness.run()
    compiled = len(graphs)
    assert compiled >= 1
    assert run(harness) == expected
    assert len(graphs) == compiled, "an adapter's step recompiled the graph"
    assert harness.token_ids("base-after") == expected["base-alone"]
