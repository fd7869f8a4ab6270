"""CTranslate2's ``model.bin`` read with numpy: the spec's name, its variables and their aliases.

The format (CTranslate2's ``ModelSpec._serialize``, read back by ``src/models/model.cc``), all
little-endian: a ``uint32`` binary version; from version 2 the spec's name (a string) and its
revision (``uint32``); a ``uint32`` count of variables, each a name (string), a ``uint8`` rank,
``rank`` ``uint32`` dimensions, a ``uint8`` type id (from version 4; before it an item size) and a
``uint32`` byte count followed by the raw values; then (from version 3) a ``uint32`` count of
aliases, each two strings: the alias and the variable it names. A string is a ``uint16`` length
counting a trailing NUL, then its UTF-8 bytes and the NUL.

The file is memory-mapped and every length is checked against what is left of it before anything
is read, so a damaged or truncated file raises ``Ct2FormatError`` naming the offset instead of
reading past its end or allocating what a corrupt count asks for.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SUPPORTED_VERSIONS = range(4, 7)  # 4: type ids; 5 and 6 changed nothing this reader sees
# CTranslate2's ``DataType`` enum, in its order (include/ctranslate2/types.h); bfloat16 has no numpy type
_DTYPES: dict[int, np.dtype] = {
    0: np.dtype("<f4"),
    1: np.dtype("i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<f2"),
    5: np.dtype("<u2"),  # bfloat16's bits: widened to float32 by ``as_float32``
}
BFLOAT16 = 5


class Ct2FormatError(ValueError):
    """The file is not a CTranslate2 model this reader understands; the message says where and why."""


@dataclass
class Ct2Variable:
    name: str
    values: np.ndarray  # a read-only view into the mapped file, in the stored dtype
    type_id: int

    def as_float32(self) -> np.ndarray:
        """The values as float32 (exact from float16, bfloat16 and float32); integer types are refused."""
        if self.type_id == BFLOAT16:
            return (self.values.astype(np.uint32) << 16).view(np.float32)
        if self.values.dtype.kind != "f":
            raise Ct2FormatError(f"variable {self.name} holds {self.values.dtype} values, not floats (quantized?)")
        return self.values.astype(np.float32)

    def scalar(self) -> int:
        """A flag or count the spec stores as a 0-d variable (``num_heads``, ``pre_norm``, ``activation``)."""
        if self.values.ndim != 0:
            raise Ct2FormatError(f"variable {self.name} has shape {self.values.shape}, not a scalar")
        return int(self.values)


@dataclass
class Ct2Model:
    path: Path
    binary_version: int
    spec: str  # e.g. "WhisperSpec"
    revision: int
    variables: dict[str, Ct2Variable] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)  # alias -> the variable name it stands for

    def get(self, name: str) -> Ct2Variable:
        """A variable by its name or an alias of it; a missing one is a format error naming it."""
        target = self.aliases.get(name, name)
        if target not in self.variables:
            raise Ct2FormatError(f"{self.path.name} ({self.spec}) has no variable {name!r}")
        return self.variables[target]

    def has(self, name: str) -> bool:
        return self.aliases.get(name, name) in self.variables


class _Cursor:
    def __init__(self, data: memoryview, path: Path) -> None:
        self.data, self.offset, self.path = data, 0, path

    def take(self, size: int, what: str) -> memoryview:
        if size < 0 or self.offset + size > len(self.data):
            raise Ct2FormatError(
                f"{self.path.name} ends inside {what} at byte {self.offset} (needs {size} bytes, "
                f"{len(self.data) - self.offset} left): truncated or not a CTranslate2 model"
            )
        chunk = self.data[self.offset : self.offset + size]
        self.offset += size
        return chunk

    def number(self, fmt: str, what: str) -> int:
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        length = self.number("H", what)
        raw = bytes(self.take(length, what))
        if length == 0 or raw[-1] != 0:
            raise Ct2FormatError(f"{self.path.name}: {what} at byte {self.offset - length} is not a NUL-ended string")
        return raw[:-1].decode("utf-8")


def read_ct2(path: Path) -> Ct2Model:
    """Every variable and alias of ``path`` (a ``model.bin``), as views into the memory-mapped file."""
    path = Path(path)
    with path.open("rb") as source:
        if path.stat().st_size == 0:
            raise Ct2FormatError(f"{path} is empty")
        mapped = mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ)
    cursor = _Cursor(memoryview(mapped), path)
    version = cursor.number("I", "the binary version")
    if version not in SUPPORTED_VERSIONS:
        raise Ct2FormatError(
            f"{path.name} has CTranslate2 binary version {version}; this reader reads versions "
            f"{SUPPORTED_VERSIONS.start}-{SUPPORTED_VERSIONS.stop - 1}"
        )
    model = Ct2Model(path, version, cursor.string("the spec name"), cursor.number("I", "the spec revision"))
    for _ in range(cursor.number("I", "the variable count")):
        name = cursor.string("a variable name")
        shape = tuple(cursor.number("I", f"{name}'s shape") for _ in range(cursor.number("B", f"{name}'s rank")))
        type_id = cursor.number("B", f"{name}'s type")
        if type_id not in _DTYPES:
            raise Ct2FormatError(f"{path.name}: variable {name} has unknown type id {type_id}")
        dtype = _DTYPES[type_id]
        size = cursor.number("I", f"{name}'s byte count")
        if size != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise Ct2FormatError(f"{path.name}: variable {name} {list(shape)} has {size} bytes, not its shape's")
        values = np.frombuffer(cursor.take(size, f"{name}'s values"), dtype=dtype).reshape(shape)
        model.variables[name] = Ct2Variable(name, values, type_id)
    for _ in range(cursor.number("I", "the alias count")):
        alias = cursor.string("an alias")
        model.aliases[alias] = cursor.string(f"the variable {alias} aliases")
    if cursor.offset != len(cursor.data):
        raise Ct2FormatError(f"{path.name} has {len(cursor.data) - cursor.offset} bytes after its last alias")
    return model
