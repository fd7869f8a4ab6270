"""The model itself: where weights come from (registry, GGUF cache, loading), how they sit in
memory (packed and quantized linears), the attention function the engine registers, the runner that
runs one batched forward per step, and ``--compile``."""
