"""``--quantization gguf`` on every served family whose GGUF transformers can read.

Each family's tiny model is written as a GGUF the way transformers expects to read it back (names
from the ``gguf`` package's map for the file's architecture, rows in the order transformers' own
tensor processor turns into the model's), linears as Q4_0 and the embedding and LM head as Q8_0;
the model's float weights are set to the file's dequantized values (what transformers would load).
``quantize_model(..., "gguf")`` then swaps the file's own blocks in, and greedy decoding through the
engine must equal ``generate()`` on that same quantized model, up to a near tie of two logits
(``assert_equal_until_a_near_tie``: the 4-bit kernel quantizes activations to int8, as llama.cpp).
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import MODEL_ARCH_NAMES, GGMLQuantizationType, GGUFWriter, get_tensor_name_map, quants
from torch import nn
from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor
from transformers.pytorch_utils import Conv1D

from decoding.model.quantization import quantize_model
from tests.arch_families import EOS
from tests.engine_harness import EngineHarness
from tests.near_tie import assert_equal_until_a_near_tie, near_ties
from tests.test_architectures import NEW_TOKENS, SERVED, hf_generate, model_of, params, prompt

# model_type -> the architecture llama.cpp writes in general.architecture (transformers reads these)
GGUF_ARCH = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe",
    "qwen2_moe": "qwen2moe",
    "phi3": "phi3",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
    "stablelm": "stablelm",
    "gpt2": "gpt2",
    "starcoder2": "starcoder2",
    "gpt_oss": "gpt-oss",
}


def hf_order(processor: TensorProcessor, gguf_name: str, num_rows: int) -> np.ndarray:
    """Row j of transformers' tensor is row ``order[j]`` of the file's (a transpose keeps the file's rows)."""
    rows = np.arange(num_rows, dtype=np.float64).reshape(num_rows, 1)
    processed = np.asarray(processor.process(rows, gguf_name, parsed_parameters={"tensors": {}}).weights)
    return processed[:, 0].astype(np.int64) if processed.shape == rows.shape else np.arange(num_rows)


def write_gguf(model: nn.Module, arch: str, path: Path) -> int:
    """Write the model's linears and embeddings as GGUF blocks; returns how many tensors."""
    config = model.config.get_text_config()
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config.to_dict())
    key = next(k for k, v in MODEL_ARCH_NAMES.items() if v == arch)
    names = get_tensor_name_map(key, config.num_hidden_layers)
    writer = GGUFWriter(str(path), arch)
    count = 0
    for hf_name, module in model.named_modules():
        if not isinstance(module, nn.Linear | Conv1D | nn.Embedding) or names.get_name(hf_name) is None:
            continue
        weight = module.weight.detach().float()
        weight = weight.t() if isinstance(module, Conv1D) else weight  # [out, in], as GGUF stores it
        if weight.shape[1] % 32 or weight.shape[0] == 1:  # llama.cpp keeps vectors (a shared-expert gate) float
            continue
        gguf_name = f"{names.get_name(hf_name)}.weight"
        kind = GGMLQuantizationType.Q4_0 if isinstance(module, nn.Linear | Conv1D) else GGMLQuantizationType.Q8_0
        if module is model.get_output_embeddings():
            kind = GGMLQuantizationType.Q8_0
        order = hf_order(processor, gguf_name, weight.shape[0])
        in_file = np.empty(tuple(weight.shape), dtype=np.float32)
        in_file[order] = weight.numpy()
        raw = quants.quantize(in_file, kind)
        dequantized = torch.from_numpy(quants.dequantize(raw, kind)[order].copy())
        module.weight.data.copy_(dequantized.t() if isinstance(module, Conv1D) else dequantized)
        writer.add_tensor(gguf_name, raw, raw_dtype=kind)
        count += 1
    writer.add_block_count(config.num_hidden_layers)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return count


def test_every_served_family_transformers_reads_a_gguf_of_is_here():
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    readable = {f.model_type for f in SERVED if f.model_type.removesuffix("_text") in GGUF_CONFIG_MAPPING}
    assert readable <= set(GGUF_ARCH)


@pytest.mark.parametrize("model_type", sorted(GGUF_ARCH))
def test_gguf_blocks_equal_hf_on_the_same_weights(model_type, smollm2_tokenizer, tmp_path):
    model = copy.deepcopy(model_of(model_type))
    path = tmp_path / f"{model_type}.gguf"
    assert write_gguf(model, GGUF_ARCH[model_type], path) > 0
    kinds = quantize_model(model, "gguf", gguf_path=path)
    assert kinds["gguf Q4_0"] > 0, kinds
    want = hf_generate(model, prompt(1), max_new_tokens=NEW_TOKENS, do_sample=False)
    ties = near_ties(model, prompt(1), want)
    harness = EngineHarness(model, smollm2_tokenizer, [EOS])
    harness.add("r", prompt(1), params("greedy"))
    harness.run()
    assert_equal_until_a_near_tie(harness.token_ids("r"), want, ties)

