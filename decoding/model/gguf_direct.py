"""A GGUF served from its own blocks (``--quantization gguf``) with no float copy made, on disk or in memory.

The model is built from its config on the meta device (parameters without storage; buffers such
as RoPE's frequencies computed for real), then filled from the file: every quantized weight that
``quantize_model`` serves as blocks (linears, the embedding, the LM head) goes straight into its
block matrix, and only the rest (norms, biases, any tensor the file keeps in float, or a quantized
tensor no block matrix takes, such as fused MoE experts) is dequantized, by transformers' own
per-tensor code (``load_gguf_checkpoint``'s loop: the ``gguf`` package's dequantizer, then the
architecture's tensor processor), so those tensors are exactly the ones a float load gets. The
151,936-row embedding of Qwen2.5 stays in its blocks and dequantizes only the rows it looks up.
Qwen2.5-Coder-1.5B: 6.7 GB of float32 safetensors written and ~110 s to ready before; now nothing
but its config and tokenizer (``gguf_metadata``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from accelerate import init_empty_weights
from gguf import dequantize
from torch import nn
from transformers import AutoModelForCausalLM, GenerationConfig, PretrainedConfig
from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map
from transformers.pytorch_utils import Conv1D

from decoding.model.gguf_metadata import fast_gguf_reads
from decoding.model.quantization import quantize_model
from decoding.model.quantization.gguf_file import GgufWeights
from decoding.model.quantization.gguf_index import GgufIndex
from decoding.model.registry import ModelLoadError


def empty_model(config: PretrainedConfig, metadata: Path, dtype: torch.dtype, attention: str | None) -> nn.Module:
    """The causal LM of ``config``, parameters on the meta device, buffers real; ``metadata``: the
    folder holding its generation_config.json."""
    options = {"dtype": dtype} | ({"attn_implementation": attention} if attention else {})
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, **options)
    model.tie_weights()  # as from_pretrained does: a tied LM head holds the embedding's parameter
    model.generation_config = GenerationConfig.from_pretrained(str(metadata))
    return model


def gguf_blocks_model(gguf_file: Path, model: nn.Module) -> nn.Module:
    """Fill ``empty_model``'s parameters from ``gguf_file``: blocks where they serve, floats elsewhere."""
    _load_floats(model, gguf_file, _block_tensors(model, gguf_file))
    quantize_model(model, "gguf", gguf_path=gguf_file)
    missing = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_meta]
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        kind = model.config.model_type
        raise ModelLoadError(f"{gguf_file.name} has no tensor for {shown}, which the {kind} model needs")
    return model


def _block_tensors(model: nn.Module, gguf_file: Path) -> set[str]:
    """The file's tensor names ``quantize_model`` will serve as blocks: quantized weights of linears
    (``nn.Linear``, GPT-2's ``Conv1D``), of the input embedding and of the LM head."""
    weights = GgufWeights(gguf_file, model)
    try:
        takers = {id(model.get_input_embeddings()), id(model.get_output_embeddings())}
        names = {
            f"{name}.weight"
            for name, module in model.named_modules()
            if id(module) in takers or type(module) in (nn.Linear, Conv1D)
        }
        return {weights.tensors[name].name for name in names if weights.is_quantized(name)}
    finally:
        weights.close()


def _load_floats(model: nn.Module, gguf_file: Path, skip: set[str]) -> None:
    """Dequantize and place every tensor but ``skip``, as ``load_gguf_checkpoint`` reads them."""
    index = GgufIndex(gguf_file)
    config = model.config.get_text_config().to_dict()
    processor = TENSOR_PROCESSORS.get(index.architecture, TensorProcessor)(config=config)
    with fast_gguf_reads():
        key_mapping = get_gguf_hf_weights_map(model, processor)
    parsed: dict[str, dict] = {"tensors": {}, "config": config}
    for tensor in index.tensors:
        if tensor.name in skip:
            continue
        weights = dequantize(tensor.data, tensor.tensor_type)
        result = processor.process(
            weights=weights, name=tensor.name, tensor_key_mapping=key_mapping, parsed_parameters=parsed
        )
        if result.name in key_mapping:
            parsed["tensors"][key_mapping[result.name]] = torch.from_numpy(np.copy(result.weights))
    _place(model, parsed["tensors"])


def _place(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Put each tensor where its name says, replacing the meta parameter in every module that shares it
    (a tied LM head holds the embedding's)."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for leaf, param in module._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append((module, leaf))
    for name, value in tensors.items():
        owner_name, _, leaf = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        current = owner._parameters.get(leaf)
        target = current if current is not None else owner._buffers.get(leaf)
        if target is None:
            raise ModelLoadError(f"the GGUF's tensor for {name} has no place in the {model.config.model_type} model")
        if tuple(value.shape) != tuple(target.shape):
            raise ModelLoadError(f"{name}: the GGUF holds shape {tuple(value.shape)}, the model {tuple(target.shape)}")
        value = value.to(target.dtype)  # the dtype from_config gave it (``--dtype``; fp32-kept modules stay fp32)
        if current is None:
            owner._buffers[leaf] = value
            continue
        param = nn.Parameter(value, requires_grad=False)
        for module, shared_leaf in holders.get(id(current), [(owner, leaf)]):
            module._parameters[shared_leaf] = param
