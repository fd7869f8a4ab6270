"""The engine on a CUDA device equals transformers' ``generate()`` on the same device and dtype.

float32: every strategy of the architecture matrix alone, then all of them in one mixed batch (twice:
the second round from the prefix cache), then sixteen requests at once through the decode steps
replayed from CUDA graphs (``--compile`` on a GPU), an assistant model and a JSON schema. Equal token
for token, except that two logits closer than ``F32_TIE`` may swap (cuBLAS picks its kernels, hence
its summation order, by shape: a batch of sixteen rows is summed otherwise than one). bfloat16 is
equal until a near tie of ``tests/near_tie.NEAR_TIE``, as transformers' own bfloat16 runs are.
"""

from __future__ import annotations

import copy
import functools
import os
import random

import pytest
import torch

from decoding.model.cuda_graphs import use_cuda_graphs
from decoding.params import GenerationParams
from tests import reference_decoding
from tests.arch_families import EOS, FAMILIES, VOCAB
from tests.engine_harness import EngineHarness, as_served, tiny_llama
from tests.gpu.device import DEVICE
from tests.near_tie import NEAR_TIE

NEW = 10
F32_TIE = 1e-4  # of the top logit
DEFAULT_FAMILIES = ("llama", "qwen2", "mistral", "gemma3_text", "gemma2", "gpt_oss", "deepseek_v3", "phi3")
ALL = os.environ.get("DECODA_GPU_ALL_FAMILIES") == "1"
FAMILY_NAMES = [f.model_type for f in FAMILIES if f.refused is None and (ALL or f.model_type in DEFAULT_FAMILIES)]


def prompt(index: int, vocab: int = VOCAB) -> list[int]:
    rng = random.Random(index)
    base = [rng.randrange(3, vocab) for _ in range(rng.randrange(7, 12))]
    return base + base[:6] if index % 2 else base


def hf_generate(model: torch.nn.Module, ids: list[int], seed: int | None = None, **kwargs: object) -> list[int]:
    if seed is not None:
        torch.manual_seed(seed)
    device = model.device
    with torch.inference_mode():
        mask = torch.ones(1, len(ids), dtype=torch.long, device=device)
        out = model.generate(torch.tensor([ids], device=device), attention_mask=mask, eos_token_id=EOS, pad_token_id=0,
                             top_k=0, **kwargs)  # fmt: skip
    tokens = out[0, len(ids) :].tolist()
    return tokens[: tokens.index(EOS) + 1] if EOS in tokens else tokens


STRATEGIES = {
    "greedy": (dict(), lambda m, p: hf_generate(m, p, max_new_tokens=NEW, do_sample=False)),
    "sampling": (dict(do_sample=True, temperature=0.8, seed=7),
                 lambda m, p: hf_generate(m, p, seed=7, max_new_tokens=NEW, do_sample=True, temperature=0.8)),
    "beam": (dict(num_beams=3), lambda m, p: hf_generate(m, p, max_new_tokens=NEW, num_beams=3)),
    "contrastive": (dict(penalty_alpha=0.6, top_k=4),
                    lambda m, p: reference_decoding.contrastive_search(m, p, 4, 0.6, NEW, EOS)),
    "dola": (dict(dola_layers=[0, 1]), lambda m, p: reference_decoding.dola(m, p, [0, 1], NEW, EOS)),
    "prompt_lookup": (dict(prompt_lookup_num_tokens=3),
                      lambda m, p: hf_generate(m, p, max_new_tokens=NEW, do_sample=False, prompt_lookup_num_tokens=3)),
}  # fmt: skip


@functools.cache
def model_of(model_type: str) -> torch.nn.Module:
    return next(f for f in FAMILIES if f.model_type == model_type).build(seed=0).to(DEVICE)


@functools.cache
def served_of(model_type: str) -> torch.nn.Module:
    return as_served(model_of(model_type))


@functools.cache
def expected(model_type: str, strategy: str, index: int) -> tuple[int, ...]:
    return tuple(STRATEGIES[strategy][1](model_of(model_type), prompt(index)))


def top_gaps(model: torch.nn.Module, ids: list[int], tokens: list[int]) -> list[float]:
    """Per generated position, how far (relative to the top logit) the runner-up lies below the top."""
    with torch.inference_mode():
        logits = model(torch.tensor([ids + tokens], device=model.device)).logits[0, len(ids) - 1 :].float()
    top2 = logits.topk(2, dim=-1).values
    return ((top2[:, 0] - top2[:, 1]) / top2[:, 0].abs().clamp(min=1e-6)).tolist()


def assert_same(got: list[int], want: list[int], model: torch.nn.Module, ids: list[int], tie: float, what: str):
    """Token for token, or parted at a position where transformers' own top two lie within ``tie``."""
    if got == want:
        return
    index = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
    gaps = top_gaps(model, ids, want)
    gap = gaps[index] if index < len(gaps) else float("inf")
    assert gap < tie, f"{what}: parted at token {index} ({got} vs {want}) where the top-2 gap is {gap:.2e}"


@pytest.mark.parametrize("model_type", FAMILY_NAMES)
def test_every_strategy_alone_equals_transformers_on_cuda(model_type, tokenizer):
    for strategy, (knobs, _) in STRATEGIES.items():
        harness = EngineHarness(served_of(model_type), tokenizer, [EOS], served=True, device=DEVICE)
        harness.add("r", prompt(1), GenerationParams(max_new_tokens=NEW, **knobs))
        harness.run()
        want = list(expected(model_type, strategy, 1))
        assert_same(harness.token_ids("r"), want, model_of(model_type), prompt(1), F32_TIE, f"{model_type} {strategy}")


@pytest.mark.parametrize("model_type", FAMILY_NAMES)
def test_every_strategy_in_one_mixed_batch_and_from_the_prefix_cache_on_cuda(model_type, tokenizer):
    harness = EngineHarness(served_of(model_type), tokenizer, [EOS], served=True, device=DEVICE,
                            max_num_batched_tokens=16, block_size=4)  # fmt: skip
    cases = [(strategy, index) for strategy in STRATEGIES for index in (0, 1)]
    for round_ in ("cold", "warm"):
        for strategy, index in cases:
            harness.add(f"{round_}-{strategy}-{index}", prompt(index), GenerationParams(max_new_tokens=NEW,
                        **STRATEGIES[strategy][0]))  # fmt: skip
        harness.run()
    for round_ in ("cold", "warm"):
        for strategy, index in cases:
            want = list(expected(model_type, strategy, index))
            assert_same(harness.token_ids(f"{round_}-{strategy}-{index}"), want, model_of(model_type), prompt(index),
                        F32_TIE, f"{model_type} {round_} {strategy} prompt {index}")  # fmt: skip


@pytest.fixture(scope="module")
def llama_f32(tokenizer):
    return tiny_llama(len(tokenizer), seed=1).to(DEVICE)


def sixteen(vocab: int) -> list[tuple[list[int], dict]]:
    rng = random.Random(3)
    cases = []
    for i in range(16):
        ids = [rng.randrange(3, vocab) for _ in range(rng.randrange(4, 60))]
        knobs = dict(do_sample=True, temperature=0.9, top_p=0.9, seed=i) if i % 2 else {}
        cases.append((ids, knobs))
    return cases


def reference(model: torch.nn.Module, ids: list[int], knobs: dict, new: int) -> list[int]:
    if knobs:
        return hf_generate(model, ids, seed=knobs["seed"], max_new_tokens=new, do_sample=True,
                           temperature=knobs["temperature"], top_p=knobs["top_p"])  # fmt: skip
    return hf_generate(model, ids, max_new_tokens=new, do_sample=False)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "cuda-graphs"])
def test_sixteen_requests_at_once_equal_each_alone(llama_f32, tokenizer, graphs):
    served = as_served(llama_f32)
    if graphs:
        use_cuda_graphs(served)
    harness = EngineHarness(served, tokenizer, [EOS], served=True, device=DEVICE, max_num_batched_tokens=128)
    cases = sixteen(len(tokenizer))
    for i, (ids, knobs) in enumerate(cases):
        harness.add(f"r{i}", ids, GenerationParams(max_new_tokens=24, **knobs))
    harness.run()
    for i, (ids, knobs) in enumerate(cases):
        want = reference(llama_f32, ids, knobs, 24)
        assert_same(harness.token_ids(f"r{i}"), want, llama_f32, ids, F32_TIE, f"request {i}")
    if graphs and DEVICE == "cuda":
        assert harness.engine.runner.graphs.captures >= 3  # 16 rows, then fewer as requests end


def test_bfloat16_greedy_and_graphs_equal_transformers_until_a_near_tie(tokenizer):
    model = tiny_llama(len(tokenizer), seed=2, num_layers=4).to(DEVICE, torch.bfloat16)
    served = as_served(model)
    use_cuda_graphs(served)
    harness = EngineHarness(served, tokenizer, [EOS], served=True, device=DEVICE, max_num_batched_tokens=128)
    cases = [(ids, {}) for ids, _ in sixteen(len(tokenizer))]
    for i, (ids, _) in enumerate(cases):
        harness.add(f"r{i}", ids, GenerationParams(max_new_tokens=20))
    harness.run()
    for i, (ids, _) in enumerate(cases):
        want = hf_generate(model, ids, max_new_tokens=20, do_sample=False)
        assert_same(harness.token_ids(f"r{i}"), want, model, ids, NEAR_TIE, f"bf16 request {i}")


def test_an_assistant_model_drafts_on_cuda_and_greedy_stays_greedy(llama_f32, tokenizer):
    from decoding.engine.core import Engine

    stranger = tiny_llama(len(tokenizer), seed=99, num_layers=1).to(DEVICE)
    harness = EngineHarness(llama_f32, tokenizer, [EOS], device=DEVICE)
    harness.engine = Engine(harness.engine.runner.model, tokenizer, [EOS], harness.engine.limits, harness._collect,
                            torch.device(DEVICE), assistants={"stranger": as_served(stranger)})  # fmt: skip
    cases = [ids * 2 for ids, _ in sixteen(len(tokenizer))[:4]]
    for i, ids in enumerate(cases):
        harness.add(f"a{i}", ids, GenerationParams(max_new_tokens=20, assistant_model="stranger"))
    harness.run()
    for i, ids in enumerate(cases):
        want = hf_generate(llama_f32, ids, max_new_tokens=20, do_sample=False, assistant_model=copy.deepcopy(stranger))
        assert_same(harness.token_ids(f"a{i}"), want, llama_f32, ids, F32_TIE, f"assisted {i}")


def test_a_json_schema_holds_on_cuda(tokenizer):
    import json

    from decoding.params.structured import StructuredOutput
    from decoding.params.validate import validate
    from decoding.structured.compiler import GrammarCompiler

    vocab = len(tokenizer)
    model = tiny_llama(vocab, seed=5).to(DEVICE)
    compiler = GrammarCompiler(tokenizer, vocab, [EOS])
    properties = {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer", "minimum": 0, "maximum": 999}}
    schema = {"type": "object", "properties": properties, "required": ["name", "n"], "additionalProperties": False}
    harness = EngineHarness(model, tokenizer, [EOS], device=DEVICE)
    strategies = [{}, {"num_beams": 2}, {"do_sample": True, "seed": 3}, {"penalty_alpha": 0.5, "top_k": 3}]
    for i, knobs in enumerate(strategies):
        params = GenerationParams(structured_output=StructuredOutput("json", schema), max_new_tokens=80, **knobs)
        validate(params)
        params = params.replace(compiled_grammar=compiler.compile(params.structured_output)[0])
        harness.add(f"s{i}", prompt(i, vocab), params)
    harness.run()
    for i in range(4):
        assert harness.finish_reason(f"s{i}") == "stop", harness.text(f"s{i}")
        value = json.loads(harness.text(f"s{i}"))
        assert set(value) == {"name", "n"} and isinstance(value["n"], int), harness.text(f"s{i}")
