"""Swap a loaded model's linears and embeddings for low-bit ones (``--quantization``), in place.

Modes (vLLM's flag name and values where they exist):

* ``none``: float weights (then packed for oneDNN by ``weight_layout``).
* ``gguf``: the GGUF file's own blocks, every quantized tensor the file has (through the native
  integer kernel, ``block_matrix``, where it runs; otherwise PyTorch's int4 kernel); tensors the file
  keeps in float (norms, and any F32/F16 matrix) stay float. A block type without a kernel path
  is refused at load, naming the tensor and the type.
* ``int8``: every linear, the embedding and the LM head, int8 per output channel.
* ``int4``: every linear int4 per 32-column group (asymmetric); the embedding and the LM head
  int8 per channel (they set every logit, and a 4-bit LM head costs most of the quality), and
  so is a linear whose input width is not a multiple of 32.

``nn.Linear`` and GPT-2's ``Conv1D`` (the same product, weight stored transposed) are swapped;
transformers 5 keeps a MoE layer's experts as fused 3-D parameters, and those stay float.

A tied embedding and LM head become one matrix used both ways (``modules``). After the swap the
float weights are dropped and freed memory is handed back to the OS, so the resident size is the
low-bit one.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from decoding.model.packed_linear import own_remaining_tensors
from decoding.model.quantization.affine import AffineCodes
from decoding.model.quantization.block_matrix import BlockMatrix, fits
from decoding.model.quantization.int4_matrix import Int4Matrix
from decoding.model.quantization.ktile_matrix import KTileMatrix
from decoding.model.quantization.ktile_matrix import fits as ktile_fits
from decoding.model.quantization.modules import LookupMatrix, LowBitMatrix, QuantizedEmbedding, QuantizedLinear
from decoding.model.quantization.sibling_products import fuse_sibling_products
from decoding.model.quantization.weight_only import INT4_GROUP, quantize_int4, quantize_int8

logger = logging.getLogger(__name__)

QUANTIZATION_MODES = ("none", "gguf", "int8", "int4")


class _Source:
    """Builds the low-bit matrix for one float weight, or None to keep it float."""

    def __init__(self, mode: str, gguf_path: Path | None, model: nn.Module) -> None:
        self.mode = mode
        self.gguf = None
        if mode == "gguf":
            from decoding.model.quantization.gguf_file import GgufWeights

            if gguf_path is None:
                raise ValueError("--quantization gguf needs a model loaded from a GGUF file; use int8 or int4")
            self.gguf = GgufWeights(gguf_path, model)

    def matrix(self, name: str, weight: torch.Tensor, *, lookup: bool) -> tuple[LowBitMatrix, str] | None:
        if self.gguf is not None:
            if not self.gguf.is_quantized(name):
                return None
            codes = self.gguf.codes(name)
            _check_same(name, codes, weight, self.gguf.rows_sample(codes.shape[0]))
            kind = f"gguf {self.gguf.block_type(name).name}"  # type: ignore[union-attr]
            return _codes_matrix(codes, lookup), kind
        if self.mode == "int4" and not lookup:
            if weight.shape[1] % INT4_GROUP == 0:
                return _codes_matrix(quantize_int4(weight), lookup=False), "int4 g32"
            # a width no group size divides (DeepSeek's tiny test ranks): int8 rather than a refusal
            return quantize_int8(weight), f"int8 per-channel (in_features not a multiple of {INT4_GROUP})"
        return quantize_int8(weight), "int8 per-channel"

    def close(self) -> None:
        if self.gguf is not None:
            self.gguf.close()


def _codes_matrix(codes: AffineCodes, lookup: bool) -> LowBitMatrix:
    """GGUF's K-quants (Q4_K, Q6_K) on the tiled kernel that keeps their factors (products and
    lookups); other codes on the native block kernel where they fit it on this CPU (faster at a few
    rows; 8-bit codes also serve an embedding's rows), else PyTorch's int4 kernel (Q6_K's 16-column
    groups, 5- to 8-bit codes without AVX-512 VNNI, a 4-bit embedding's row lookup)."""
    if ktile_fits(codes):
        return KTileMatrix(codes)  # type: ignore[arg-type]
    if fits(codes) and (not lookup or codes.bits > 4):
        return BlockMatrix(codes)
    return Int4Matrix(codes, lookup=lookup)


def quantize_model(model: nn.Module, mode: str, *, gguf_path: Path | None = None) -> Counter[str]:
    """Replace the model's linears/embedding in place; returns how many weights each kind took."""
    if mode not in QUANTIZATION_MODES:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_MODES)}, got {mode!r}")
    kinds: Counter[str] = Counter()
    if mode == "none":
        return kinds
    # a model built on the meta device (``gguf_blocks_model``) holds real tensors only where the file keeps floats
    if any(p.device.type != "cpu" for p in model.parameters() if not p.is_meta):
        raise ValueError(f"--quantization {mode} runs CPU kernels; it needs --device cpu")
    source = _Source(mode, gguf_path, model)
    try:
        names = {id(module): name for name, module in model.named_modules()}
        embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
        tied = head is not None and head.weight is embedding.weight
        shared = _swap_embedding(model, embedding, names[id(embedding)], source, kinds)
        if head is not None:
            if tied and shared is not None:
                model.set_output_embeddings(QuantizedLinear(shared[0], head.bias, shared[1]))
                kinds[shared[1] + " (tied LM head)"] += 1
            else:
                _swap_linear(model, names[id(head)], head, source, kinds)
        skip = {id(embedding), id(head)}
        for name, module in list(model.named_modules()):
            if id(module) in skip:
                continue
            if type(module) is nn.Linear:
                _swap_linear(model, name, module, source, kinds)
            elif type(module) is Conv1D:  # GPT-2's projections: a linear whose weight is stored [in, out]
                _swap_linear(model, name, module, source, kinds, weight=module.weight.t())
    finally:
        source.close()
    fuse_sibling_products(model)  # q/k/v and gate/up block matrices read as one each
    own_remaining_tensors(model)  # frees the float checkpoint's file mapping and the heap it left
    logger.info("quantization %s: %s", mode, ", ".join(f"{n} x {k}" for k, n in sorted(kinds.items())))
    return kinds


def _swap_embedding(model: nn.Module, embedding: nn.Module, name: str, source: _Source,
                    kinds: Counter[str]) -> tuple[LookupMatrix, str] | None:  # fmt: skip
    built = source.matrix(f"{name}.weight", embedding.weight, lookup=True)
    if built is None:
        return None
    matrix, kind = built
    scale = getattr(embedding, "embed_scale", None)  # Gemma3TextScaledWordEmbedding
    dtype = embedding.weight.dtype
    model.set_input_embeddings(
        QuantizedEmbedding(matrix, dtype, kind, float(scale) if scale is not None else None)  # type: ignore[arg-type]
    )
    kinds[kind + " (embedding)"] += 1
    return matrix, kind  # type: ignore[return-value]


def _swap_linear(
    model: nn.Module, name: str, linear: nn.Module, source: _Source, kinds: Counter[str],
    weight: torch.Tensor | None = None,
) -> None:  # fmt: skip
    """``weight``: the ``[out, in]`` matrix when the module stores it otherwise (``Conv1D``)."""
    built = source.matrix(f"{name}.weight", linear.weight if weight is None else weight, lookup=False)
    if built is None:
        return
    matrix, kind = built
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, QuantizedLinear(matrix, linear.bias, kind))
    kinds[kind] += 1


def _check_same(name: str, codes: AffineCodes, weight: torch.Tensor, rows: torch.Tensor) -> None:
    """Sampled rows of the file's blocks must be the weights transformers loaded (a wrong name or row order).
    A weight on the meta device (a model built from its config, never given float weights) has only a shape."""
    if codes.shape != tuple(weight.shape):
        raise ValueError(f"{name}: GGUF tensor has shape {codes.shape}, the model {tuple(weight.shape)}")
    if weight.is_meta:
        return
    dequantized = codes.rows(rows)
    reference = weight.detach()[rows].float()
    tolerance = (1e-5 if weight.dtype == torch.float32 else 1e-2) * float(reference.abs().max())
    if float((dequantized - reference).abs().max()) > tolerance:
        raise ValueError(f"{name}: the GGUF blocks do not match the weights transformers dequantized")
