"""Build the whole engine from an ``EngineConfig``: load, size the KV pool, start the worker.

Everything that touches the model, loading included, runs on the worker thread. PyTorch's CPU
ops run on an OpenMP team that belongs to the thread calling them; a second team (say, the one
a loading thread leaves behind) makes libgomp count more threads than cores, and it then stops
spinning between parallel regions and puts its threads to sleep. Measured on this project's
2-core machine: a 16-row decode step took ~100 ms on a worker thread after loading elsewhere,
~65 ms when the worker thread had loaded the model itself.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from decoding.client_api import ServedModel
from decoding.config import EngineConfig
from decoding.custom.loading import LoadedMethod, load_custom_methods, preflight
from decoding.engine.client import ChatTemplates, WorkerEngineClient
from decoding.engine.core import Engine
from decoding.engine.image_prompts import ImagePrompter
from decoding.engine.limits import EngineLimits
from decoding.engine.lora import LoraLimits
from decoding.engine.prebuild import start_builds
from decoding.engine.transcription import whisper_transcriber
from decoding.engine.warmup import warm_up
from decoding.engine.worker import Worker
from decoding.kv.memory import kv_cache_bytes
from decoding.kv.paged_attention import native_available
from decoding.model.attention import register_attention
from decoding.model.compile import compile_model
from decoding.model.cuda_graphs import use_cuda_graphs
from decoding.model.dtype_choice import resolve_dtype
from decoding.model.loading import LoadedModel, load_model
from decoding.model.packed_linear import pack_linears
from decoding.model.registry import ModelLoadError
from decoding.model.seq2seq import is_encoder_decoder, model_task, seq2seq_facts
from decoding.model.vision_tower import load_processor, takes_images
from decoding.params.model_checks import ModelFacts
from decoding.structured.compiler import GrammarCompiler
from decoding.telemetry import EngineObserver
from decoding.text.tokenizer_copy import thread_copy

logger = logging.getLogger(__name__)


def resolve_max_model_len(config: EngineConfig, max_position_embeddings: int) -> int:
    """The model's own context unless set: the paged cache holds only the tokens rows really have."""
    if config.max_model_len is None:
        return max_position_embeddings
    if config.max_model_len > max_position_embeddings:
        raise ValueError(
            f"--max-model-len {config.max_model_len} exceeds the model's max_position_embeddings "
            f"{max_position_embeddings}"
        )
    return config.max_model_len


def prepare_forward(model: torch.nn.Module, *, compile: bool, device: torch.device | None = None) -> None:
    """Compile the forward, or pack the linears: inductor cannot trace oneDNN-packed weights. On a
    GPU, ``--compile`` replays decode steps from CUDA graphs instead (``decoding.model.cuda_graphs``)."""
    if compile and device is not None and device.type == "cuda":
        use_cuda_graphs(model)
    elif compile:
        compile_model(model)
    else:
        pack_linears(model)


@dataclass
class _Built:
    loaded: LoadedModel
    max_model_len: int
    assistants: dict[str, LoadedModel]
    custom_methods: dict[str, LoadedMethod]


def start_engine_client(config: EngineConfig, observer: EngineObserver | None = None) -> WorkerEngineClient:
    worker, built = Worker.spawn(lambda: build_engine(config, observer))
    loaded = built.loaded
    facts = ModelFacts(
        vocab_size=worker.engine.ctx.vocab_size,
        max_model_len=built.max_model_len,
        num_layers=worker.engine.ctx.num_layers,
        max_num_seqs=config.max_num_seqs,
        max_num_beams=config.max_num_beams,
        assistants=tuple(built.assistants),
        custom_methods=tuple(method.info for method in built.custom_methods.values()),
        bos_token_id=getattr(loaded.model.config, "bos_token_id", None),  # HF's detector reads it (T5: none)
        max_chars_per_token=max_chars_per_token(loaded.tokenizer),
        takes_images=takes_images(loaded.model.config),
        **seq2seq_facts(loaded.model),
    )
    client = WorkerEngineClient(
        worker,
        loaded.tokenizer,
        served_name=config.served_model_name or loaded.served_name,
        facts=facts,
        max_queue=config.max_queue,
        has_chat_template=loaded.has_chat_template,
        generation_defaults=loaded.generation_defaults,
        served_model=_served(config.served_model_name or loaded.served_name, "target", loaded, built, config),
        assistants=[_served(name, "assistant", built.assistants[name], built, config) for name in built.assistants],
        default_assistant=config.default_assistant,
        templates=ChatTemplates.for_model(getattr(loaded.tokenizer, "chat_template", None),
                                          _read(config.chat_template), _read(config.tool_chat_template)),  # fmt: skip
        compiler=GrammarCompiler(thread_copy(loaded.tokenizer), worker.engine.ctx.vocab_size, loaded.eos_token_ids),
        observer=observer,
        max_loaded_loras=config.max_loaded_loras,
    )
    # speech to text on a Whisper model: each window of audio one request (engine/transcription.py)
    client.transcriber = whisper_transcriber(loaded.model, thread_copy(loaded.tokenizer), loaded.eos_token_ids[0],
                                             client.generate, config.max_audio_seconds,
                                             lambda work: worker.call(lambda _engine: work()))  # fmt: skip
    if client.transcriber is not None and observer is not None:
        client.transcriber.observer = observer
    if facts.takes_images:  # a vision-language model: chats with images go through its processor
        client.image_prompter = ImagePrompter(load_processor(config.model), loaded.model, config.max_image_pixels)
    return client


def _served(name: str, role: str, loaded: LoadedModel, built: _Built, config: EngineConfig) -> ServedModel:
    """One ``/v1/models`` entry: what a client needs to know about the weights behind a name."""
    return ServedModel(
        name, role, built.max_model_len, architecture=loaded.architecture, model_type=loaded.model_type,
        dtype=config.dtype, quantization=loaded.quantization,  # ``auto`` resolved per model
        task=model_task(loaded.model),
    )  # fmt: skip


def build_engine(config: EngineConfig, observer: EngineObserver | None = None) -> tuple[Engine, _Built]:
    """Load the model (and assistants) and build the engine; call it on the thread that will step it."""
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    dtype, why = resolve_dtype(config.dtype, config.device)
    logger.info("dtype %s (%s)", dtype, why)
    config = dataclasses.replace(config, dtype=dtype)  # assistants and reports see the concrete dtype
    device = torch.device(config.device)
    preflight(config.custom_generate, config.trust_remote_code)  # before the (slow) model load
    builds_done = start_builds(config)
    loaded = load_model(
        config.model,
        dtype=config.dtype,
        device=config.device,
        cache_dir=config.cache_dir,
        attn_implementation=register_attention(),
        quantization=config.quantization,
        model_index_url=config.model_index_url,
    )
    model = loaded.model
    _check_seq2seq_flags(config, loaded)
    builds_done()  # the compile below (and a first step) needs every one of them
    prepare_forward(model, compile=config.compile, device=torch.device(config.device))
    max_model_len = resolve_max_model_len(config, loaded.max_position_embeddings)
    assistants = load_assistants(config, loaded)
    custom_methods = load_custom_methods(config.custom_generate, config.trust_remote_code, model)
    limits = EngineLimits(
        max_model_len=max_model_len,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        request_timeout=config.request_timeout,
        kv_cache_bytes=kv_cache_bytes(config.kv_cache_memory),
        block_size=config.block_size,
        prefix_caching=config.prefix_caching,
        caller_weights=config.caller_weights,
        max_prefill_share=config.max_prefill_share,
        fair_share=config.fair_share,
    )
    # The worker detokenizes on its own copy: fast tokenizers are not safe to share across threads.
    engine = Engine(
        model,
        thread_copy(loaded.tokenizer),
        loaded.eos_token_ids,
        limits,
        lambda _: None,
        device,
        observer,
        assistants={
            name: assistant.model
            if assistant.tokenizer.get_vocab() == loaded.tokenizer.get_vocab()
            else (assistant.model, thread_copy(assistant.tokenizer), set(assistant.eos_token_ids))
            for name, assistant in assistants.items()
        },
        custom_methods=custom_methods,
        lora=LoraLimits(config.max_loras, config.max_lora_rank) if config.serves_loras else None,
    )
    if engine.loras is not None:  # --lora-modules: loaded (or refused, with the reason) before serving
        engine.loras.served_names = tuple(dict.fromkeys([config.served_model_name or loaded.served_name,
                                                         loaded.served_name]))  # fmt: skip
        for name, path, base_model_name in config.lora_modules:
            engine.loras.load(name, path, base_model_name)
    if config.compile:
        seconds = warm_up(engine, loaded.tokenizer("Warm up the compiled layers.").input_ids)
        logger.info("compiled the forward in %.0f s, before serving", seconds)
    logger.info(
        "engine ready: model=%s max_model_len=%d max_num_seqs=%d kv_cache=%.0f MiB (%d blocks of %d, "
        "prefix caching %s, paged attention %s)",
        loaded.served_name,
        max_model_len,
        config.max_num_seqs,
        engine.pool.nbytes() / 2**20,
        engine.pool.blocks.num_blocks,
        engine.pool.block_size,
        "on" if config.prefix_caching else "off",
        "native" if native_available() else "gathering (no C++ compiler)",
    )
    if observer is not None:
        observer.on_cache_config(engine.pool.block_size, engine.pool.blocks.num_blocks, config.prefix_caching)
    return engine, _Built(loaded, max_model_len, assistants, custom_methods)


def _check_seq2seq_flags(config: EngineConfig, loaded: LoadedModel) -> None:
    """Refuse at start the flags an encoder-decoder model is not served with yet, naming each."""
    if takes_images(loaded.model.config):
        for flag, given in {"--compile": config.compile, "--enable-lora/--lora-modules": config.serves_loras}.items():
            if given:
                raise ModelLoadError(f"{flag} is not served with vision-language models ({loaded.architecture}) yet")
    if not is_encoder_decoder(loaded.model.config):
        return
    flags = {"--compile": config.compile, "--assistant-model": bool(config.assistant_models),
             "--enable-lora/--lora-modules": config.serves_loras, "--custom-generate": bool(config.custom_generate)}
    for flag, given in flags.items():
        if given:
            raise ModelLoadError(f"{flag} is not served with encoder-decoder models ({loaded.architecture}) yet")


def load_assistants(config: EngineConfig, target: LoadedModel) -> dict[str, LoadedModel]:
    """Preload ``--assistant-model`` draft models on the target's device and dtype.

    An assistant with the target's vocabulary drafts token ids directly; one with a different
    tokenizer drafts through text (universal assisted decoding, ``strategies/universal.py``).
    """
    assistants: dict[str, LoadedModel] = {}
    target_vocab = target.tokenizer.get_vocab()
    for name, spec in config.assistant_models:
        loaded = load_model(
            spec, dtype=config.dtype, device=config.device, cache_dir=config.cache_dir,
            attn_implementation=register_attention(), quantization=config.quantization,
            model_index_url=config.model_index_url,
        )  # fmt: skip
        name = name or loaded.served_name
        through_text = loaded.tokenizer.get_vocab() != target_vocab
        pack_linears(loaded.model)
        assistants[name] = loaded
        logger.info(
            "assistant %s loaded from %s%s", name, spec, " (other tokenizer: drafts via text)" if through_text else ""
        )
    if config.default_assistant is not None and config.default_assistant not in assistants:
        raise ValueError(
            f"--default-assistant {config.default_assistant!r} is not among the assistants {sorted(assistants)}"
        )
    return assistants


def _read(path: str | None) -> str | None:
    return None if path is None else Path(path).read_text()


def max_chars_per_token(tokenizer: object) -> int:
    """The longest vocabulary entry: a byte-level BPE entry has one character per byte it encodes and
    a SentencePiece one one per character, so no token spells more characters of text than this."""
    return max((len(token) for token in tokenizer.get_vocab()), default=1)
