"""LoRA adapters per request (PEFT's), mixed freely in one batched forward.

``adapter`` reads and checks a PEFT folder, ``product`` is the batched low-rank product, ``bank``
wraps the model's projections and holds the resident adapters' stacked matrices, ``residency``
decides which adapters are resident and which KV rows use which.
"""

from decoding.model.lora.adapter import LoraRefused, LoraWeights, read_adapter
from decoding.model.lora.bank import LoraBank, LoraLinear, lora_of
from decoding.model.lora.residency import LoraInUse, LoraResidency

__all__ = [
    "LoraBank",
    "LoraInUse",
    "LoraLinear",
    "LoraRefused",
    "LoraResidency",
    "LoraWeights",
    "lora_of",
    "read_adapter",
]
