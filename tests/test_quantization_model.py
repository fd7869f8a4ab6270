"""Quantized models end to end: a GGUF's own blocks swapped into the model, int8/int4 at load, the
same engine serving every strategy on them, and clear refusals (unsupported block type, bad flag)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, quants

from decoding.model.quantization import QUANTIZATION_MODES, UnsupportedBlockType, quantize_model
from decoding.model.quantization.modules import QuantizedEmbedding, QuantizedLinear
from decoding.params import GenerationParams
from tests.engine_harness import EngineHarness, hf_greedy, tiny_llama

T = GGMLQuantizationType
EOS = 2
# llama.cpp stores each projection under its own name; q and k rows are permuted for its RoPE
PROJECTIONS = {
    "self_attn.q_proj": ("attn_q", T.Q4_0),
    "self_attn.k_proj": ("attn_k", T.Q5_0),
    "self_attn.v_proj": ("attn_v", T.Q8_0),
    "self_attn.o_proj": ("attn_output", T.Q4_1),
    "mlp.gate_proj": ("ffn_gate", T.Q4_1),
    "mlp.up_proj": ("ffn_up", T.Q5_1),
    "mlp.down_proj": ("ffn_down", T.Q4_0),
}


@pytest.fixture(scope="module")
def tiny(smollm2_tokenizer):
    return tiny_llama(len(smollm2_tokenizer), seed=3)


def llama_cpp_row_order(rows: int, heads: int) -> np.ndarray:
    """llama.cpp's ``permute`` for q/k (``convert_hf_to_gguf.py``), as a row order."""
    index = np.arange(rows)
    return index.reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(rows)


def write_gguf(model: torch.nn.Module, path: Path, override: dict[str, GGMLQuantizationType] | None = None) -> None:
    """Quantize ``model`` into a llama GGUF the way llama.cpp lays it out, and set the model's float
    weights to the file's dequantized values (what transformers would load from it)."""
    config = model.config
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_hidden_layers)

    def put(gguf_name: str, module: torch.nn.Module, kind: GGMLQuantizationType, heads: int | None = None) -> None:
        kind = (override or {}).get(gguf_name, kind)
        weight = module.weight.detach().numpy()
        order = llama_cpp_row_order(weight.shape[0], heads) if heads else np.arange(weight.shape[0])
        if kind == T.IQ4_NL:  # no quantizer for it here; zero bytes are a valid encoding
            raw = np.zeros((weight.shape[0], weight.shape[1] // 32 * GGML_QUANT_SIZES[kind][1]), dtype=np.uint8)
        else:
            raw = quants.quantize(weight[order], kind)
        dequantized = np.empty_like(weight)
        dequantized[order] = quants.dequantize(raw, kind)
        module.weight.data.copy_(torch.from_numpy(dequantized))
        writer.add_tensor(gguf_name, raw, raw_dtype=kind)

    put("token_embd.weight", model.model.embed_tokens, T.Q8_0)
    for i, layer in enumerate(model.model.layers):
        for hf_name, (gguf_name, kind) in PROJECTIONS.items():
            heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}.get(gguf_name)
            put(f"blk.{i}.{gguf_name}.weight", layer.get_submodule(hf_name), kind, heads)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_blocks_replace_the_weights_transformers_dequantized(tiny, tmp_path):
    model = copy.deepcopy(tiny)
    write_gguf(model, tmp_path / "tiny.gguf")
    quantized = copy.deepcopy(model)
    kinds = quantize_model(quantized, "gguf", gguf_path=tmp_path / "tiny.gguf")
    assert kinds["gguf Q4_0"] == 4 and kinds["gguf Q5_1"] == 2 and kinds["gguf Q8_0 (embedding)"] == 1
    assert kinds["gguf Q8_0 (tied LM head)"] == 1
    assert not any(type(m) is torch.nn.Linear for m in quantized.modules())
    assert isinstance(quantized.get_input_embeddings(), QuantizedEmbedding)
    head = quantized.get_output_embeddings()
    assert isinstance(head, QuantizedLinear) and head.matrix is quantized.get_input_embeddings().matrix  # one copy
    ids = torch.tensor([[5, 900, 77, 4000, 31, 2]])
    with torch.no_grad():
        expected, got = model(ids).logits, quantized(ids).logits
    # int8 activations per block in the block kernel (bfloat16 ones in PyTorch's): the logits agree within 2%
    assert float((got - expected).abs().max()) <= 2e-2 * float(expected.abs().max())


def test_a_misnamed_or_misordered_tensor_is_caught_at_load(tiny, tmp_path):
    model = copy.deepcopy(tiny)
    write_gguf(model, tmp_path / "tiny.gguf")
    with torch.no_grad():  # the float model no longer matches the file: the load refuses
        model.model.layers[0].self_attn.q_proj.weight.mul_(-1)
    with pytest.raises(ValueError, match="do not match"):
        quantize_model(model, "gguf", gguf_path=tmp_path / "tiny.gguf")


def test_an_unsupported_block_type_is_refused_at_load(tiny, tmp_path):
    model = copy.deepcopy(tiny)
    write_gguf(model, tmp_path / "tiny.gguf", override={"blk.1.ffn_up.weight": T.IQ4_NL})
    with pytest.raises(UnsupportedBlockType, match=r"blk\.1\.ffn_up\.weight uses GGUF block type IQ4_NL"):
        quantize_model(model, "gguf", gguf_path=tmp_path / "tiny.gguf")


def test_gguf_mode_needs_a_gguf_source(tiny):
    with pytest.raises(ValueError, match="needs a model loaded from a GGUF file"):
        quantize_model(copy.deepcopy(tiny), "gguf", gguf_path=None)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_weight_only_modes_quantize_every_linear_and_the_embedding(tiny, mode):
    model = copy.deepcopy(tiny)
    kinds = quantize_model(model, mode)
    linear_kind = "int8 per-channel" if mode == "int8" else "int4 g32"
    assert kinds[linear_kind] == 14
    assert kinds["int8 per-channel (embedding)"] == 1 and kinds["int8 per-channel (tied LM head)"] == 1
    ids = torch.tensor([[5, 900, 77, 4000]])
    with torch.no_grad():
        expected, got = tiny(ids).logits, model(ids).logits
    tolerance = 0.05 if mode == "int8" else 0.25  # quantization error, relative to the largest logit
    assert float((got - expected).abs().max()) <= tolerance * float(expected.abs().max())


@pytest.fixture(scope="module", params=["gguf", "int8", "int4"])
def quantized_tiny(request, tiny, tmp_path_factory):
    model = copy.deepcopy(tiny)
    path = None
    if request.param == "gguf":
        path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
        write_gguf(model, path)
    quantize_model(model, request.param, gguf_path=path)
    return model


PROMPTS = [[5, 900, 77, 4000, 31], [12, 13, 14], [300, 301, 302, 303, 304, 305, 306]]


def test_engine_greedy_equals_hf_generate_on_the_same_quantized_model(quantized_tiny, smollm2_tokenizer):
    for i, prompt in enumerate(PROMPTS):
        harness = EngineHarness(quantized_tiny, smollm2_tokenizer, [EOS])
        harness.add("r", prompt, GenerationParams(max_new_tokens=12))
        harness.run()
        assert harness.token_ids("r") == hf_greedy(quantized_tiny, prompt, 12, eos_token_id=EOS), f"prompt {i}"


STRATEGIES = {
    "sampling": dict(do_sample=True, temperature=0.8, top_k=20, seed=7),
    "beam": dict(num_beams=3),
    "contrastive": dict(penalty_alpha=0.6, top_k=4),
    "dola": dict(dola_layers="high"),
    "prompt_lookup": dict(prompt_lookup_num_tokens=3),
}


def test_every_strategy_runs_unchanged_in_one_batch(quantized_tiny, smollm2_tokenizer):
    harness = EngineHarness(quantized_tiny, smollm2_tokenizer, [EOS])
    for name, knobs in STRATEGIES.items():
        harness.add(name, PROMPTS[0], GenerationParams(max_new_tokens=8, ignore_eos=True, **knobs))
    harness.run()
    for name in STRATEGIES:
        assert len(harness.token_ids(name)) == 8, name


def test_server_settings_accept_exactly_the_engine_modes():
    from decoding.model.loading import QUANTIZATION_CHOICES
    from server.config.settings import QUANTIZATION_MODES as SERVER_MODES
    from server.config.sources import load_settings

    assert SERVER_MODES == QUANTIZATION_CHOICES == ("auto", *QUANTIZATION_MODES)
    assert load_settings(environ={}).engine_config().quantization == "auto"  # a packaged model's own default
    assert load_settings(environ={"DECODA_QUANTIZATION": "gguf"}).engine_config().quantization == "gguf"
    with pytest.raises(ValueError, match="quantization must be one of auto, none, gguf, int8, int4, got 'int3'"):
        load_settings(environ={"DECODA_QUANTIZATION": "int3"})


def test_the_embedded_gguf_serves_in_bfloat16():
    """``--quantization gguf --dtype auto`` on a bf16 CPU: the load check's bfloat16 logits differ from
    eager attention's by ~7% of the largest logit, as transformers' own SDPA does; it was refused."""
    from decoding.model.attention import ATTENTION_NAME, register_attention
    from decoding.model.loading import load_model

    loaded = load_model(
        "smollm2-135m-instruct", dtype="bfloat16", quantization="gguf", attn_implementation=register_attention()
    )
    assert loaded.model.config._attn_implementation == ATTENTION_NAME
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
