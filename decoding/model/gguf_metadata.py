"""A GGUF's config, generation config and tokenizer, read from its metadata once and kept as small files.

transformers rebuilds a config from most GGUF architectures (qwen2, llama, gemma3...) through the
``gguf`` package's ``GGUFReader``, which makes a numpy view of every metadata element: Qwen2.5's
151,936 tokens and 151,387 merges took 45-60 s on this project's 2-core machine, read twice (config,
then tokenizer). ``FastGgufReader`` gives transformers the same fields (the same ``parts``/``data``/
``types`` layout, the same values) built with ``struct`` in about 2 s, and ``fast_gguf_reads`` puts
it in place of ``GGUFReader`` while transformers reads a file (it imports the name at call time).
The tokenizer built from the metadata (~10 s for 151,936 tokens) and the configs are then written
once into Decoda's cache (a few MB; no weights), so later starts read them in about 2 s.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import os
import shutil
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import numpy as np
import transformers
import transformers.modeling_gguf_pytorch_utils as gguf_utils
from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from decoding.model.cache_files import cache_key, made
from decoding.model.quantization.gguf_index import GgufIndex

logger = logging.getLogger(__name__)

METADATA_MARKER = "decoda-metadata.json"  # written last: present = complete
STRING, ARRAY = 8, 9
# GGUF metadata value types of a fixed size, as numpy types (GGUFReader's own)
SCALARS = {
    0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32, 7: np.bool_,
    10: np.uint64, 11: np.int64, 12: np.float64,
}  # fmt: skip
_swap = threading.Lock()  # one patched read at a time


class _Field:
    """``gguf.ReaderField``'s face: ``parts`` (key length, key, type, then the value's pieces),
    ``data`` (which parts are values) and ``types`` (``[type]``, or ``[ARRAY, item type]``)."""

    __slots__ = ("name", "parts", "data", "types", "offset")

    def __init__(self, name: str, parts: list, data: list[int], types: list[int]) -> None:
        self.name, self.parts, self.data, self.types, self.offset = name, parts, data, types, 0


class FastGgufReader:
    """What transformers reads of ``GGUFReader``: ``fields`` (every metadata key, values as the
    reader lays them out; a string is its bytes) and ``tensors`` (name, type, memory-mapped data)."""

    def __init__(self, path: str | os.PathLike, mode: str = "r") -> None:
        index = GgufIndex(path)
        self.tensors = index.tensors
        self.fields: dict[str, _Field] = {}
        buffer = memoryview(index.file)
        try:
            version, tensors, count = struct.unpack_from("<IQQ", buffer, 4)
            for name, value, kind in (("GGUF.version", version, 4), ("GGUF.tensor_count", tensors, 10),
                                      ("GGUF.kv_count", count, 10)):  # fmt: skip
                self.fields[name] = _Field(name, [np.array([value], SCALARS[kind])], [0], [kind])
            at = 24
            for _ in range(count):
                key, at = _string(buffer, at)
                (kind,) = struct.unpack_from("<I", buffer, at)
                parts: list = [np.array([len(key)], np.uint64), np.frombuffer(key, np.uint8)]
                parts.append(np.array([kind], np.uint32))
                data, types, at = _value(buffer, at + 4, kind, parts)
                name = key.decode("utf-8")
                self.fields[name] = _Field(name, parts, data, types)
        finally:
            buffer.release()

    def get_field(self, key: str) -> _Field | None:
        return self.fields.get(key)


def _string(buffer: memoryview, at: int) -> tuple[bytes, int]:
    (length,) = struct.unpack_from("<Q", buffer, at)
    return bytes(buffer[at + 8 : at + 8 + length]), at + 8 + length


def _value(buffer: memoryview, at: int, kind: int, parts: list) -> tuple[list[int], list[int], int]:
    """Appends the value's parts; returns (data indices, types, offset past the value)."""
    if kind in SCALARS:
        item = np.dtype(SCALARS[kind])
        parts.append(np.frombuffer(buffer, item, 1, at).copy())
        return [len(parts) - 1], [kind], at + item.itemsize
    if kind == STRING:
        text, end = _string(buffer, at)
        parts += [np.array([len(text)], np.uint64), text]
        return [len(parts) - 1], [kind], end
    if kind != ARRAY:
        raise ValueError(f"unknown GGUF metadata type {kind}")
    item_kind, count = struct.unpack_from("<IQ", buffer, at)
    at += 12
    parts += [np.array([item_kind], np.uint32), np.array([count], np.uint64)]
    data: list[int] = []
    if item_kind in SCALARS:
        item = np.dtype(SCALARS[item_kind])
        values = np.frombuffer(buffer, item, count, at).copy()
        data = list(range(len(parts), len(parts) + count))
        parts += [values[i : i + 1] for i in range(count)]
        return data, [ARRAY, item_kind], at + count * item.itemsize
    if item_kind != STRING:
        raise ValueError(f"GGUF metadata array of type {item_kind} (nested arrays) is not read")
    for _ in range(count):
        (length,) = struct.unpack_from("<Q", buffer, at)
        parts.append((length,))
        data.append(len(parts))
        parts.append(bytes(buffer[at + 8 : at + 8 + length]))
        at += 8 + length
    return data, [ARRAY, STRING], at


@contextlib.contextmanager
def fast_gguf_reads() -> Iterator[None]:
    """transformers' GGUF reads (config, tokenizer, dequantized weights) through ``FastGgufReader``, each
    file read and its metadata parsed once (the config and the tokenizer each read it), and its
    tensor-name maps built once per architecture: ``get_gguf_hf_weights_map`` rebuilds the ``gguf``
    package's map for every submodule it recurses into (397 times, 0.1 s each, for SmolLM2)."""
    with _swap:
        reader, name_map, checkpoint = gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint
        gguf.GGUFReader = functools.lru_cache(maxsize=None)(FastGgufReader)  # type: ignore[misc,assignment]
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
        gguf_utils.load_gguf_checkpoint = _metadata_once(checkpoint)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map  # type: ignore[misc]
            gguf_utils.load_gguf_checkpoint = checkpoint


def _metadata_once(load: Callable[..., dict]) -> Callable[..., dict]:
    """``load_gguf_checkpoint`` whose metadata-only result (``return_tensors=False``) is parsed once per
    file; each caller gets its own copy to change."""
    parsed: dict[str, dict] = {}

    def once(path: str, return_tensors: bool = False, model_to_load: object = None, torch_dtype: object = None) -> dict:
        if return_tensors:
            return load(path, return_tensors=True, model_to_load=model_to_load, torch_dtype=torch_dtype)
        if path not in parsed:
            parsed[path] = load(path)
        return copy.deepcopy(parsed[path])

    return once


def metadata_folder(name: str, gguf_file: Path, cache_root: Path) -> Path:
    """config.json, generation_config.json and the tokenizer's files for ``gguf_file``, written once.

    Keyed like the converted folders (the file's path, size and mtime; transformers' version), written
    under a temporary name and renamed into place, so replicas sharing a volume each write it at most once.
    """
    final = cache_root / "gguf-metadata" / f"{name}-{cache_key([gguf_file])}"
    if (final / METADATA_MARKER).is_file():
        return final
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=made(final.parent)))
    try:
        logger.info("reading %s's config and tokenizer from its metadata once, into %s", gguf_file.name, final)
        write_metadata(gguf_file, tmp)
        marker = {"gguf": str(gguf_file), "transformers": transformers.__version__}
        (tmp / METADATA_MARKER).write_text(json.dumps(marker))
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared by replicas' users
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / METADATA_MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def write_metadata(gguf_file: Path, out: Path) -> None:
    """The files ``from_pretrained`` would find in a model folder, from the GGUF's metadata alone.

    The generation config is the one transformers gives a model loaded from the GGUF (made from the
    config: the eos/bos/pad ids), which ``save_pretrained`` wrote into the converted folders before.
    """
    folder, file = str(gguf_file.parent), gguf_file.name
    with fast_gguf_reads():
        config = AutoConfig.from_pretrained(folder, gguf_file=file)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
