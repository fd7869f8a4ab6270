"""Low-bit weights served as they are: a GGUF file's own blocks, or int8/int4 made at load.

Modules, one idea each: ``affine`` (codes + scale + offset, the common form), ``gguf_blocks``
(GGUF block types → that form), ``gguf_file`` (a model's tensors in a GGUF file),
``weight_only`` (int8/int4 quantizers for float weights), ``int4_matrix`` / ``int8_matrix`` (the
CPU kernels), ``packed_layout`` (rows back out of the packed int4 layout, for tied embeddings),
``modules`` (``nn.Linear``/``nn.Embedding`` drop-ins) and ``apply`` (swapping them into a model).

The package's names are imported when first asked for: ``apply`` imports transformers, and the
server imports ``block_matrix`` (torch alone) to start building its kernel before the engine's own
imports, which would otherwise all happen first (decoding.engine.prebuild).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from decoding.model.quantization.apply import QUANTIZATION_MODES, quantize_model
    from decoding.model.quantization.gguf_blocks import UnsupportedBlockType

__all__ = ["QUANTIZATION_MODES", "UnsupportedBlockType", "quantize_model"]
_HOMES = {"QUANTIZATION_MODES": "apply", "quantize_model": "apply", "UnsupportedBlockType": "gguf_blocks"}


def __getattr__(name: str) -> object:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
