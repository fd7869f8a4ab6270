"""A GGUF dequantized once into a safetensors folder (``--quantization none``), shared safely by replicas.

Serving a GGUF's weights as floats means dequantizing every tensor, which transformers does in tens
of seconds; a safetensors folder loads in about one. So the file is converted once into Decoda's
cache, in the dtype it is served in (a bfloat16 server writes bfloat16 files, half float32's size),
keyed by the file, the dtype and the transformers version, and every start loads the folder. The
weights are dequantized exactly (in float32) and then cast, so they equal what a float32 copy cast
at load would give. Writes go to a temporary name renamed into place, so a crash leaves no half
cache; the log says how much was written and where. ``--quantization gguf`` never comes here: it
serves the file's own blocks (``gguf_blocks_model``).
"""

from __future__ import annotations

import gc
import hashlib
import logging
import shutil
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

from decoding.model.cache_files import cache_key, publish
from decoding.model.gguf_metadata import fast_gguf_reads
from decoding.model.registry import ModelLoadError

logger = logging.getLogger(__name__)

SOURCE_MARKER = "decoda-source.json"  # written last into a cache folder: present = complete


def converted_folder(
    name: str,
    parts: list[Path],
    cache_root: Path,
    *,
    dtype: torch.dtype = torch.float32,
    gguf_name: str | None = None,
    sha256: str | None = None,
) -> Path:
    """The safetensors folder for a GGUF (given as one file or ordered chunks) in ``dtype``, converting it once.

    The folder is written under a temporary name and renamed into place, so a crash mid-write
    leaves no half cache, and replicas starting together on one volume each convert at most once
    (the first rename wins; the others keep the winner's folder). float32 folders keep the name
    they always had, so an existing cache stays valid.
    """
    suffix = "" if dtype == torch.float32 else f"-{str(dtype).removeprefix('torch.')}"
    final = cache_root / "models" / f"{name}-{cache_key(parts)}{suffix}"
    if (final / SOURCE_MARKER).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    try:
        gguf = parts[0] if len(parts) == 1 else assemble(parts, tmp / "source" / (gguf_name or name), sha256)
        logger.info("converting %s to %s safetensors once, into %s", gguf.name, dtype, final)
        _convert_gguf(gguf, tmp, dtype)
        shutil.rmtree(tmp / "source", ignore_errors=True)
        marker = {"parts": [str(p) for p in parts], "transformers": transformers.__version__, "dtype": str(dtype)}
        written = publish(tmp, final, SOURCE_MARKER, marker)
        logger.info(
            "wrote %.0f MB (%s weights) into %s; --quantization gguf serves a GGUF's own blocks and writes none",
            written / 1e6, dtype, final,
        )  # fmt: skip
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


def _convert_gguf(gguf: Path, out: Path, dtype: torch.dtype) -> None:
    """Dequantize a GGUF into model + tokenizer + generation_config safetensors files in ``dtype``.

    transformers refuses ``save_pretrained`` on a model whose GGUF weights stay packed, so the
    file is loaded with ``GgufConfig(dequantize=True)`` in float32 (exact for every GGUF type),
    cast to ``dtype``, and any quantization record is dropped before saving.
    """
    folder, file = str(gguf.parent), gguf.name
    with fast_gguf_reads():
        model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=file, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
        )
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.to(dtype)
        model.save_pretrained(out)
        del model
        gc.collect()
        AutoTokenizer.from_pretrained(folder, gguf_file=file).save_pretrained(out)
