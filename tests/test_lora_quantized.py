"""LoRA adapters on quantized base weights (a GGUF's own blocks, int8, int4): the adapter's delta is added to
whatever the quantized linear returns, never folded into its codes. Per linear, the output is the quantized
base's plus PEFT's delta computed in float (``x @ A.T @ B.T * scaling``); an adapter whose ``B`` is zero
changes no token; generation equals ``generate()`` on the quantized model with that float delta added to
each projection, alone and mixed with the base in one batch."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from peft import PeftModel

from decoding.model.quantization import quantize_model
from decoding.model.quantization.modules import QuantizedLinear
from decoding.params import GenerationParams
from tests.engine_harness import hf_greedy, tiny_llama
from tests.test_lora_engine import EOS, GREEDY, LoraHarness, make_adapter, prompt
from tests.test_quantization_model import write_gguf


@pytest.fixture(scope="module", params=["gguf", "int8", "int4"])
def quantized(request, tmp_path_factory) -> tuple[torch.nn.Module, dict[str, Path], PeftModel]:
    """(the quantized base, adapter folders ``real`` and ``zero``, ``real``'s PeftModel on the float base)."""
    root = tmp_path_factory.mktemp(f"lora-{request.param}")
    model = tiny_llama(500, seed=7)
    gguf = None
    if request.param == "gguf":
        gguf = root / "tiny.gguf"
        write_gguf(model, gguf)  # the float weights become the file's dequantized ones
    real = make_adapter(model, root / "real", seed=1, r=8, alpha=16)
    make_adapter(model, root / "zero", seed=2, b_std=0.0)
    quantize_model(model, request.param, gguf_path=gguf)
    return model, {"real": root / "real", "zero": root / "zero"}, real


def peft_delta(peft_model: PeftModel, name: str) -> tuple[torch.Tensor, torch.Tensor, float]:
    """PEFT's own ``lora_A`` ``[r, in]``, ``lora_B`` ``[out, r]`` and scaling for the base module ``name``."""
    layer = peft_model.get_submodule(f"base_model.model.{name}")
    return layer.lora_A["default"].weight.detach(), layer.lora_B["default"].weight.detach(), layer.scaling["default"]


@contextmanager
def with_float_delta(model: torch.nn.Module, peft_model: PeftModel) -> Iterator[torch.nn.Module]:
    """``model`` (quantized) with each adapted projection's output plus PEFT's delta in float: the reference."""
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, QuantizedLinear) and name.rsplit(".", 1)[-1].endswith("_proj"):
            a, b, scaling = peft_delta(peft_model, name)
            delta = lambda _m, inputs, out, a=a, b=b, s=scaling: out + (inputs[0] @ a.T @ b.T) * s  # noqa: E731
            handles.append(module.register_forward_hook(delta))
    try:
        yield model
    finally:
        for handle in handles:
            handle.remove()


def test_each_linear_is_the_quantized_base_plus_peft_float_delta(quantized, smollm2_tokenizer):
    model, folders, real = quantized
    harness = LoraHarness(model, smollm2_tokenizer, folders)
    bank, residency = harness.engine.loras.bank, harness.engine.loras.residency
    slot = residency.acquire("real")
    generator = torch.Generator().manual_seed(0)
    checked = 0
    # 3 and 20 tokens on the adapter (one adapter's product), the adapter and the base alternating (the masked
    # stacked product), a long step half on the adapter (the padded product)
    for token_slots in ([slot] * 3, [slot] * 20, [slot, 0] * 5, [0] * 36 + [slot] * 34):
        for name, linear in bank.linears.items():
            assert isinstance(linear.base, QuantizedLinear)
            x = torch.randn(len(token_slots), linear.in_features, generator=generator)
            with torch.inference_mode(), bank.active(bank.step_for(token_slots)):
                ours = linear(x)
            with torch.inference_mode():
                base = linear.base(x)
            a, b, scaling = peft_delta(real, name)
            on_adapter = torch.tensor(token_slots) == slot
            expected = base + (x @ a.T @ b.T) * scaling * on_adapter[:, None]
            torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5)
            assert not torch.allclose(ours[on_adapter], base[on_adapter])  # the delta is really there
            checked += 1
    residency.release(slot)
    assert checked == 4 * 14


def test_a_zero_adapter_gives_the_quantized_base_tokens(quantized, smollm2_tokenizer):
    model, folders, _ = quantized
    sampled = GenerationParams(max_new_tokens=12, ignore_eos=True, do_sample=True, temperature=0.8, seed=3)
    for p in range(2):
        ids = prompt(10 + p)
        harness = LoraHarness(model, smollm2_tokenizer, folders)
        for label, params in (("greedy", GREEDY), ("sampled", sampled)):
            harness.add(f"{label}-zero", ids, params.replace(lora_name="zero"))
            harness.add(f"{label}-base", ids, params)
        harness.run()
        assert harness.token_ids("greedy-base") == hf_greedy(model, ids, 12, eos_token_id=EOS, pad_token_id=EOS,
                                                              min_new_tokens=12)  # fmt: skip
        for label in ("greedy", "sampled"):
            assert harness.token_ids(f"{label}-zero") == harness.token_ids(f"{label}-base"), (label, p)


def test_generation_with_an_adapter_equals_the_quantized_base_plus_the_float_delta(quantized, smollm2_tokenizer):
    """Each adapter request alone and beside the base and the zero adapter in one batch (steps that mix
    adapters): the quantized model's ``generate()`` with PEFT's float delta on every projection."""
    model, folders, real = quantized
    prompts = [prompt(20 + p, 8 + 3 * p) for p in range(3)]
    mixed = LoraHarness(model, smollm2_tokenizer, folders)
    for p, ids in enumerate(prompts):
        for name in ("real", None, "zero"):
            mixed.add(f"{name}{p}", ids, GREEDY.replace(lora_name=name))
    mixed.run()
    for p, ids in enumerate(prompts):
        alone = LoraHarness(model, smollm2_tokenizer, folders)
        alone.add("r", ids, GREEDY.replace(lora_name="real"))
        alone.run()
        with with_float_delta(copy.deepcopy(model), real) as reference:
            expected = hf_greedy(reference, ids, 12, eos_token_id=EOS, pad_token_id=EOS, min_new_tokens=12)
        assert alone.token_ids("r") == expected, f"prompt {p}"
        assert mixed.token_ids(f"real{p}") == expected, f"prompt {p} in the mixed batch"
        assert mixed.token_ids(f"real{p}") != mixed.token_ids(f"None{p}")  # the adapter changes the tokens
        assert mixed.token_ids(f"zero{p}") == mixed.token_ids(f"None{p}")
