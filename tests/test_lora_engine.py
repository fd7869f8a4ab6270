"""LoRA adapters in the engine: token for token what PEFT's ``PeftModel.generate()`` gives, per request,
mixed with other adapters and the base in one batch, under every strategy; refusals with the reason."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from decoding.engine.core import Engine
from decoding.engine.limits import EngineLimits
from decoding.engine.lora import LoraLimits
from decoding.model.lora import LoraInUse, LoraRefused, native
from decoding.model.lora.bank import NATIVE_SINGLE_TOKENS
from decoding.model.lora.product import (
    add_padded,
    add_single,
    add_stacked,
    add_stacked_onednn,
    gathered_delta,
    grouped_delta,
    pack_onednn,
    uses_onednn,
)
from decoding.params import GenerationParams
from tests.engine_harness import EngineHarness, as_served, tiny_llama

EOS = 2
ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base: torch.nn.Module, folder: Path, seed: int, r: int = 4, alpha: int = 8,
                 targets: list[str] | None = None, b_std: float = 0.2, **config: object) -> PeftModel:  # fmt: skip
    """A seeded PEFT LoRA adapter on a copy of ``base`` (random, non-zero ``lora_B``), saved to ``folder``."""
    torch.manual_seed(seed)
    lora = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets or ALL_TARGETS, **config)
    peft_model = get_peft_model(copy.deepcopy(base), lora)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * b_std)
    peft_model.save_pretrained(str(folder))
    return peft_model.eval()


class LoraHarness(EngineHarness):
    """An engine serving LoRA adapters (``adapters``: name -> folder) on ``model`` as the server runs it."""

    def __init__(self, model: torch.nn.Module, tokenizer: object, adapters: dict[str, Path], max_loras: int = 4,
                 max_lora_rank: int = 16, max_num_seqs: int = 32, **kv_cache: object) -> None:  # fmt: skip
        self.outputs = {}
        limits = EngineLimits(256, max_num_seqs, 512, **kv_cache)
        self.engine = Engine(as_served(model), tokenizer, [EOS], limits, self._collect, torch.device("cpu"),
                             lora=LoraLimits(max_loras, max_lora_rank))  # fmt: skip
        for name, path in adapters.items():
            self.engine.loras.load(name, str(path))


def prompt(seed: int, length: int = 12) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 400) for _ in range(length)]


def reference(model: torch.nn.Module, ids: list[int], params: GenerationParams) -> list[int]:
    """``model.generate()`` (a ``PeftModel`` or the base) for the same greedy or seeded-sampling knobs at
    batch 1 (a seeded request draws what ``generate`` draws after ``torch.manual_seed(seed)``)."""
    knobs = {"max_new_tokens": params.max_new_tokens, "do_sample": params.do_sample, "pad_token_id": EOS,
             "eos_token_id": EOS}  # fmt: skip
    if params.do_sample:
        knobs.update(temperature=params.temperature, top_p=params.top_p, top_k=0)
        torch.manual_seed(params.seed)
    if params.num_beams > 1:
        knobs["num_beams"] = params.num_beams
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), **knobs)
    return out[0, len(ids) :].tolist()


@pytest.fixture(scope="module")
def base(smollm2_tokenizer):
    return tiny_llama(500, seed=7)


@pytest.fixture(scope="module")
def adapters(base, tmp_path_factory):
    """Four seeded adapters: all projections r4, attention only r8, MLP only with rsLoRA, r16 alpha 32."""
    root = tmp_path_factory.mktemp("loras")
    specs = {
        "a": {"seed": 1},
        "b": {"seed": 2, "r": 8, "alpha": 4, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]},
        "c": {"seed": 3, "r": 6, "targets": ["gate_proj", "up_proj", "down_proj"], "use_rslora": True},
        "d": {"seed": 4, "r": 16, "alpha": 32},
    }
    made = {}
    for name, spec in specs.items():
        made[name] = (root / name, make_adapter(base, root / name, **spec))
    return made


GREEDY = GenerationParams(max_new_tokens=12, ignore_eos=True)
SAMPLED = GenerationParams(max_new_tokens=12, ignore_eos=True, do_sample=True, temperature=0.8, top_p=0.9, seed=11)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", ["a", "b", "c", "d"])
def test_each_adapter_equals_peft_generate_at_batch_1(base, adapters, smollm2_tokenizer, name, params):
    folder, peft_model = adapters[name]
    harness = LoraHarness(base, smollm2_tokenizer, {name: folder})
    ids = prompt(5)
    harness.add("r", ids, params.replace(lora_name=name))
    harness.add("base", ids, params)
    harness.run()
    expected = reference(peft_model, ids, params)
    assert harness.token_ids("r") == expected
    assert harness.token_ids("base") == reference(base, ids, params)
    assert expected != harness.token_ids("base")  # the adapter really changes the output


def _mixed_requests() -> list[tuple[str, str | None, list[int], GenerationParams]]:
    """16 requests over 4 adapters and the base, with greedy, sampling, beams, contrastive, DoLa and
    prompt lookup among them."""
    strategies = [
        GREEDY,
        SAMPLED,
        GenerationParams(max_new_tokens=8, num_beams=3, ignore_eos=True),
        GenerationParams(max_new_tokens=8, penalty_alpha=0.6, top_k=4, ignore_eos=True),
        GenerationParams(max_new_tokens=8, dola_layers="high", ignore_eos=True, repetition_penalty=1.2),
        GenerationParams(max_new_tokens=10, prompt_lookup_num_tokens=3, ignore_eos=True),
        GenerationParams(max_new_tokens=8, assistant_early_exit=1, ignore_eos=True),
    ]
    names = [None, "a", "b", "c", "d"]
    return [(f"r{i}", names[i % 5], prompt(100 + i % 6, 10 + i % 4), strategies[i % len(strategies)])
            for i in range(16)]  # fmt: skip


@pytest.fixture(scope="module")
def crowd(base, adapters, smollm2_tokenizer):
    """The sixteen mixed requests run at once, once for the tests that read them."""
    folders = {name: folder for name, (folder, _) in adapters.items()}
    harness = LoraHarness(base, smollm2_tokenizer, folders)
    for request_id, name, ids, params in _mixed_requests():
        harness.add(request_id, ids, params.replace(lora_name=name))
    harness.run()
    return harness


def test_sixteen_mixed_requests_each_equal_their_batch_1_run(base, adapters, smollm2_tokenizer, crowd):
    folders = {name: folder for name, (folder, _) in adapters.items()}
    requests = _mixed_requests()
    for request_id, name, ids, params in requests:
        alone = LoraHarness(base, smollm2_tokenizer, {name: folders[name]} if name else {})
        alone.add("alone", ids, params.replace(lora_name=name))
        alone.run()
        assert crowd.token_ids(request_id) == alone.token_ids("alone"), (request_id, name, params.strategy)
        assert len(alone.token_ids("alone")) > 0


def test_plain_strategies_in_the_crowd_equal_peft(base, adapters, crowd):
    """The greedy and seeded-sampling rows of a mixed batch are PEFT's tokens, not only the engine's own."""
    requests = _mixed_requests()
    checked = 0
    for request_id, name, ids, params in requests:
        if params in (GREEDY, SAMPLED):
            model = adapters[name][1] if name else base
            assert crowd.token_ids(request_id) == reference(model, ids, params), request_id
            checked += 1
    assert checked >= 4


def test_prefix_cache_is_not_shared_across_adapters(base, adapters, smollm2_tokenizer):
    folders = {name: folder for name, (folder, _) in adapters.items()}
    harness = LoraHarness(base, smollm2_tokenizer, folders, block_size=4)
    ids = prompt(9, 20)
    cached = {}
    for i, name in enumerate([None, "a", "b", "a", None]):
        harness.add(f"q{i}", ids, GREEDY.replace(lora_name=name))
        harness.run()
        cached[i] = harness.outputs[f"q{i}"][-1].num_cached_tokens
    assert cached[0] == 0 and cached[1] == 0 and cached[2] == 0  # a new adapter: nothing shared with the base
    assert cached[3] > 0 and cached[4] > 0  # the same adapter (or the base) again: its own blocks
    assert harness.token_ids("q1") == harness.token_ids("q3") == reference(adapters["a"][1], ids, GREEDY)
    assert harness.token_ids("q0") == harness.token_ids("q4") == reference(base, ids, GREEDY)


def test_more_adapters_than_slots_take_turns(base, adapters, smollm2_tokenizer):
    """--max-loras 1: requests of four adapters queue for the one slot (LRU), each with its own tokens."""
    folders = {name: folder for name, (folder, _) in adapters.items()}
    harness = LoraHarness(base, smollm2_tokenizer, folders, max_loras=1)
    ids = prompt(3)
    for i, name in enumerate(["a", "b", "a", "c", None, "d"]):
        harness.add(f"x{i}", ids, GREEDY.replace(lora_name=name))
    harness.add("last-a", ids, GREEDY.replace(lora_name="a"))
    harness.run()
    assert harness.token_ids("last-a") == reference(adapters["a"][1], ids, GREEDY)
    assert harness.token_ids("last-a") != reference(adapters["d"][1], ids, GREEDY)


def test_load_and_unload_while_serving(base, adapters, smollm2_tokenizer):
    folder_a, peft_a = adapters["a"]
    harness = LoraHarness(base, smollm2_tokenizer, {})
    ids = prompt(4)
    harness.add("base", ids, GREEDY)
    harness.engine.step()
    harness.engine.loras.load("a", str(folder_a))
    harness.add("with-a", ids, GREEDY.replace(lora_name="a"))
    harness.engine.step()
    with pytest.raises(LoraInUse):  # requests use it: refused, never swapped under them
        harness.engine.loras.unload("a", _in_flight(harness))
    harness.run()
    assert harness.token_ids("with-a") == reference(peft_a, ids, GREEDY)
    assert harness.token_ids("base") == reference(base, ids, GREEDY)
    harness.engine.loras.unload("a", _in_flight(harness))
    with pytest.raises(ValueError, match="not loaded"):
        harness.add("gone", ids, GREEDY.replace(lora_name="a"))
    harness.engine.loras.load("a", str(adapters["b"][0]))  # another adapter under the old name
    harness.add("new-a", ids, GREEDY.replace(lora_name="a"))
    harness.run()
    assert harness.token_ids("new-a") == reference(adapters["b"][1], ids, GREEDY)


def _in_flight(harness: EngineHarness) -> list[GenerationParams]:
    return [request.params for request in harness.engine.requests.values()]


def _config_edit(src: Path, dst: Path, **changes: object) -> Path:
    dst.mkdir()
    for file in src.iterdir():
        (dst / file.name).write_bytes(file.read_bytes())
    config = json.loads((dst / "adapter_config.json").read_text())
    config.update(changes)
    (dst / "adapter_config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"use_dora": True}, "DoRA"),
        ({"bias": "all"}, "bias='all'"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"r": 64, "lora_alpha": 8}, "above --max-lora-rank 16"),
        ({"rank_pattern": {"q_proj": 2}}, "rank_pattern"),
        ({"peft_type": "IA3"}, "only LORA"),
    ],
)
def test_refused_adapters_say_why(base, adapters, smollm2_tokenizer, tmp_path, changes, reason):
    harness = LoraHarness(base, smollm2_tokenizer, {})
    folder = _config_edit(adapters["a"][0], tmp_path / "edited", **changes)
    with pytest.raises(LoraRefused, match=reason.replace("(", r"\(").replace("[", r"\[")):
        harness.engine.loras.load("x", str(folder))


def test_refused_targets_and_bases(base, smollm2_tokenizer, tmp_path):
    harness = LoraHarness(base, smollm2_tokenizer, {})
    make_adapter(base, tmp_path / "head", seed=1, targets=["lm_head"])
    with pytest.raises(LoraRefused, match="lm_head"):
        harness.engine.loras.load("head", str(tmp_path / "head"))
    wider = LlamaForCausalLM(LlamaConfig(vocab_size=500, hidden_size=96, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()  # fmt: skip
    make_adapter(wider, tmp_path / "wide", seed=1)
    with pytest.raises(LoraRefused, match="does not fit the served model"):
        harness.engine.loras.load("wide", str(tmp_path / "wide"))
    wider.save_pretrained(tmp_path / "wide-base")  # a base named by a readable local folder is compared
    _config_edit(tmp_path / "head", tmp_path / "named", base_model_name_or_path=str(tmp_path / "wide-base"))
    with pytest.raises(LoraRefused, match="hidden_size=96"):
        harness.engine.loras.load("named", str(tmp_path / "named"))
    with pytest.raises(LoraRefused, match="no adapter_config.json"):
        harness.engine.loras.load("empty", str(tmp_path))


def test_the_product_phrasings_agree():
    torch.manual_seed(0)
    slots, rank, tokens, width, out = 5, 4, 9, 16, 12
    a = torch.randn(slots, width, rank)
    b = torch.randn(slots, rank, out)
    a[0], b[0] = 0, 0
    scale = torch.tensor([0.0, 2.0, 0.5, 1.0, 3.0])
    index = torch.tensor([0, 1, 2, 1, 4, 0, 3, 3, 2])
    x = torch.randn(tokens, width)
    expected = torch.stack([x[t] @ a[i] @ b[i] * scale[i] for t, i in enumerate(index.tolist())])
    mask = torch.zeros(tokens, slots, 1)
    mask[torch.arange(tokens), index, 0] = scale[index]
    a_cat = a.permute(1, 0, 2).reshape(width, slots * rank)
    b_cat = b.reshape(slots * rank, out)
    zero = lambda: torch.zeros(tokens, out)  # noqa: E731  (each product adds into its output in place)
    torch.testing.assert_close(add_stacked(zero(), x, a_cat, b_cat, mask, rank), expected)
    torch.testing.assert_close(gathered_delta(x, a, b, scale, index), expected)
    torch.testing.assert_close(grouped_delta(x, a, b, scale, index, [1, 2, 3, 4]), expected)
    torch.testing.assert_close(add_single(zero(), x, a[2], b[2], 0.5), x @ a[2] @ b[2] * 0.5)
    # padded: adapters 1..4 in rows of 2 (token 5 is the base's: in no row), padding zeroed by the mask
    gather = torch.tensor([1, 3, 2, 8, 6, 7, 4, 0])
    padded_mask = torch.tensor([2.0, 2.0, 0.5, 0.5, 1.0, 1.0, 3.0, 0.0]).view(4, 2, 1)
    rows = torch.tensor([0, 1, 2, 3, 4, 5, 6])
    padded = add_padded(zero(), x, a[1:], b[1:], gather, padded_mask, rows, gather[:7])
    torch.testing.assert_close(padded, expected)
    if uses_onednn(x.device, x.dtype):
        onednn = add_stacked_onednn(zero(), x, pack_onednn(a_cat.t()), pack_onednn(b_cat.t()), mask, rank)
        torch.testing.assert_close(onednn, expected)


@pytest.mark.parametrize(
    "pattern, path",
    [
        ("a" * 3, "single"),
        ("a" * 70, "single"),  # a long prompt chunk on one adapter: still two products, no mask
        ("b" * 3, "single"),  # b leaves the MLP alone: those linears are their base's
        ("a-b" * 5, "stacked"),
        ("ab" * 8, "stacked"),  # a decode step of 16 rows
        ("abcd" * 16 + "-" * 8, "padded"),  # a long step spread evenly
        ("a" * 66 + "bc", "stacked"),  # long, but one adapter holds most of it: padding would waste
        ("-" * 4 + "cd" * 40, "padded"),  # the adapters' range is the slots the step uses
    ],
)
@pytest.mark.parametrize("product", ["native", "mm", "onednn"])
def test_each_step_adds_each_tokens_own_peft_delta(base, adapters, smollm2_tokenizer, pattern, path, product):
    """Every projection of every step shape (one adapter, mixed, long and even) is its base plus PEFT's
    delta for each token's adapter, none for the base's tokens, through each product; the product the step
    takes is the one named (the native kernel: every mixed step, and one adapter's up to 16 tokens)."""
    folders = {name: folder for name, (folder, _) in adapters.items()}
    harness = LoraHarness(base, smollm2_tokenizer, folders)
    bank, residency = harness.engine.loras.bank, harness.engine.loras.residency
    if product == "onednn" and not uses_onednn(bank.device, bank.dtype):
        pytest.skip("no oneDNN here")
    if product == "native" and not native.serves(bank.device, bank.dtype):
        pytest.skip("the native LoRA kernel does not run here")
    bank.use_product(product)
    assert bank.product == product
    slots = {name: residency.acquire(name) for name in "abcd"}
    token_slots = [0 if c == "-" else slots[c] for c in pattern]
    step = bank.step_for(token_slots)
    taken = "native" if step.token_slots is not None else "single" if step.single else (
        "padded" if step.padded is not None else "stacked")  # fmt: skip
    if product == "native":
        path = "single" if path == "single" and len(pattern) > NATIVE_SINGLE_TOKENS else "native"
    elif product == "onednn" and path != "single":
        path = "stacked"
    assert taken == path
    generator = torch.Generator().manual_seed(len(pattern))
    for name, linear in bank.linears.items():
        x = torch.randn(len(token_slots), linear.in_features, generator=generator)
        with torch.inference_mode(), bank.active(step):
            ours = linear(x)
        with torch.inference_mode():
            expected = linear.base(x)
            for adapter, (_, peft_model) in adapters.items():
                layer = peft_model.get_submodule(f"base_model.model.{name}")
                if hasattr(layer, "lora_A"):
                    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
                    on = torch.tensor(token_slots) == slots[adapter]
                    expected = expected + x @ a.T @ b.T * layer.scaling["default"] * on[:, None]
        torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
