"""Find a model's weights among a GGUF file's tensors, as raw blocks, with transformers' own naming.

GGUF names tensors ``blk.N.attn_q.weight``; the ``gguf`` package's ``TensorNameMap`` for the file's
architecture maps transformers' parameter names onto those (what transformers'
``get_gguf_hf_weights_map`` does, without rebuilding the map per submodule). For some
architectures transformers also reorders rows on the way (llama.cpp permutes Llama's q/k rows for
its RoPE layout; ``LlamaTensorProcessor`` undoes it). Those reorderings move whole output rows, and
a GGUF block never spans rows, so the same permutation applies to the quantized rows as they are:
it is found by running transformers' processor on row numbers. The file's tensor table is read by
``gguf_index`` (memory-mapped, nothing dequantized), with the ``gguf`` package's names and types.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import MODEL_ARCH_NAMES, GGMLQuantizationType, get_tensor_name_map
from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

from decoding.model.quantization.affine import AffineCodes
from decoding.model.quantization.gguf_blocks import FLOAT_TYPES, decode_blocks
from decoding.model.quantization.gguf_index import GgufIndex, GgufTensor


class GgufWeights:
    """The quantized tensors of one GGUF file, by transformers parameter name (``model.layers.0...weight``)."""

    def __init__(self, path: Path, model: torch.nn.Module) -> None:
        self.path = path
        self.index = GgufIndex(path)
        architecture = self.index.architecture
        if architecture is None:
            raise ValueError(f"{path}: the GGUF file names no general.architecture")
        config: dict[str, Any] = model.config.get_text_config().to_dict()
        self.processor: TensorProcessor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config)
        # the attribute, not the dict: GPT-2's config stores it as ``n_layer``
        gguf_to_hf = _name_map(model, architecture, model.config.get_text_config().num_hidden_layers)
        self.tensors: dict[str, GgufTensor] = {
            gguf_to_hf[t.name]: t for t in self.index.tensors if t.name in gguf_to_hf
        }

    def rows_sample(self, num_rows: int) -> torch.Tensor:
        """A few row numbers (ends, middle, spread) for checking a tensor against transformers' copy."""
        picks = {0, 1, num_rows // 3, num_rows // 2, (2 * num_rows) // 3 + 1, num_rows - 2, num_rows - 1}
        return torch.tensor(sorted(p for p in picks if 0 <= p < num_rows), device="cpu")  # the file is read on the CPU

    def block_type(self, hf_name: str) -> GGMLQuantizationType | None:
        """The tensor's GGUF type; None when the file has no such tensor."""
        tensor = self.tensors.get(hf_name)
        return None if tensor is None else GGMLQuantizationType(tensor.tensor_type)

    def is_quantized(self, hf_name: str) -> bool:
        kind = self.block_type(hf_name)
        return kind is not None and kind not in FLOAT_TYPES

    def codes(self, hf_name: str) -> AffineCodes:
        """The tensor's own codes and scales, rows in transformers' order (raises UnsupportedBlockType)."""
        tensor = self.tensors[hf_name]
        raw = np.asarray(tensor.data)  # [rows, row_bytes] uint8, memory-mapped
        codes = decode_blocks(raw, GGMLQuantizationType(tensor.tensor_type), tensor_name=tensor.name)
        order = self._row_order(tensor.name, codes.shape[0])
        return codes if order is None else codes.take(torch.from_numpy(order))

    def _row_order(self, gguf_name: str, num_rows: int) -> np.ndarray | None:
        """The processor's reordering of this tensor's rows, or None when it keeps them."""
        rows = np.arange(num_rows, dtype=np.float64).reshape(num_rows, 1)
        # a scratch ``parsed_parameters``: GPT-2's processor files its LM head there instead of returning it
        processed = np.asarray(self.processor.process(rows, gguf_name, parsed_parameters={"tensors": {}}).weights)
        if processed.shape == (1, num_rows):
            # transposed into a Conv1D's [in, out] (GPT-2); the quantized layer takes the file's [out, in]
            return None
        if processed.shape != rows.shape or not np.array_equal(np.sort(processed[:, 0]), rows[:, 0]):
            raise ValueError(
                f"{gguf_name}: transformers transforms this tensor beyond reordering its rows, which "
                "--quantization gguf cannot apply to quantized blocks"
            )
        order = processed[:, 0].astype(np.int64)
        return None if np.array_equal(order, rows[:, 0]) else order

    def close(self) -> None:
        """Drop the memory map (its pages would otherwise count as resident)."""
        self.tensors.clear()
        self.index = None  # type: ignore[assignment]


def _name_map(model: torch.nn.Module, architecture: str, num_layers: int) -> dict[str, str]:
    """GGUF tensor name → transformers parameter name, for the parameters the file's map knows."""
    arch = next((key for key, value in MODEL_ARCH_NAMES.items() if value == architecture), None)
    if arch is None:
        raise ValueError(f"GGUF architecture {architecture!r} is unknown to the installed gguf package")
    names = get_tensor_name_map(arch, int(num_layers or 0))
    mapping: dict[str, str] = {}
    for hf_name, _ in model.named_parameters(remove_duplicate=False):
        stem, _, suffix = hf_name.rpartition(".")
        gguf_name = names.get_name(stem)
        if gguf_name is not None:
            mapping.setdefault(f"{gguf_name}.{suffix}", hf_name)
    return mapping
