"""LoRA adapters at runtime: ``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter`` (vLLM's)."""
