"""The bodies of vLLM's runtime LoRA routes: an adapter's name, and for loading its folder."""

from __future__ import annotations

from server.translate.strict import Strict


class LoadLoraAdapterRequest(Strict):
    """``POST /v1/load_lora_adapter``: serve the PEFT folder ``lora_path`` (under ``--lora-dir``; a relative
    path is taken from there) as the model ``lora_name``."""

    lora_name: str
    lora_path: str


class UnloadLoraAdapterRequest(Strict):
    """``POST /v1/unload_lora_adapter``: stop serving ``lora_name`` (refused, 409, while requests use it)."""

    lora_name: str
