"""A GGUF file's tensor table, read without turning its metadata into arrays.

The ``gguf`` package's ``GGUFReader`` makes numpy views of every metadata value, one per element of
an array: the tokenizer's ~100,000 strings in SmolLM2's file took ~4 s of every ``--quantization
gguf`` start, and the weights need none of them. This reads what they do need (the architecture's
name, the data alignment and the tensor table) and steps over the rest; a string array is walked by
its lengths alone. Tensor data stays memory-mapped and is cut the way ``GGUFReader`` cuts it (a
quantized tensor as ``[rows, row_bytes]`` uint8), with the ``gguf`` package's own type sizes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

MAGIC = b"GGUF"
_LENGTH = struct.Struct("<Q")
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
# GGUF metadata value types of a fixed size: uint8, int8, uint16, int16, uint32, int32, float32,
# bool, then (after string 8 and array 9) uint64, int64, float64
FIXED_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
FLOAT_ITEMS = {
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True)
class GgufTensor:
    """One tensor of the file: GGUF's name, block type, dims (ggml order: the row length first) and
    where its bytes start in the file."""

    name: str
    tensor_type: GGMLQuantizationType
    dims: tuple[int, ...]
    offset: int
    file: np.memmap

    @property
    def data(self) -> np.ndarray:
        """The tensor's bytes, memory-mapped: quantized types as ``[..., rows, row_bytes]`` uint8."""
        shape = tuple(reversed(self.dims))
        elements = int(np.prod(shape, dtype=np.int64))
        item = FLOAT_ITEMS.get(self.tensor_type)
        if item is not None:
            size = elements * np.dtype(item).itemsize
            return self.file[self.offset : self.offset + size].view(item).reshape(shape)
        block_size, type_size = GGML_QUANT_SIZES[self.tensor_type]
        size = elements * type_size // block_size
        return self.file[self.offset : self.offset + size].reshape(quant_shape_to_byte_shape(shape, self.tensor_type))


class GgufIndex:
    """The architecture and the tensors of one GGUF file (little-endian, version 2 or 3)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.file = np.memmap(self.path, mode="r")
        self._buffer = memoryview(self.file)
        self._at = 0
        if bytes(self._take(4)) != MAGIC:
            raise ValueError(f"{self.path}: not a GGUF file")
        version = self._unpack("<I")
        if version not in SUPPORTED_VERSIONS:
            raise ValueError(f"{self.path}: GGUF version {version} (big-endian, or unsupported); versions 2 and 3 load")
        tensor_count, field_count = self._unpack("<Q"), self._unpack("<Q")
        self.architecture: str | None = None
        alignment = DEFAULT_ALIGNMENT
        for _ in range(field_count):
            key, kind = self._string(), self._unpack("<I")
            if key == "general.architecture" and kind == STRING:
                self.architecture = self._string()
            elif key == "general.alignment" and kind == 4:
                alignment = self._unpack("<I")
                if alignment == 0 or alignment & (alignment - 1):
                    raise ValueError(f"{self.path}: alignment {alignment} is not a power of two")
            else:
                self._skip(kind)
        entries = []
        for _ in range(tensor_count):
            name = self._string()
            dims = tuple(self._unpack("<Q") for _ in range(self._unpack("<I")))
            entries.append((name, GGMLQuantizationType(self._unpack("<I")), dims, self._unpack("<Q")))
        start = -(-self._at // alignment) * alignment
        self.tensors = [GgufTensor(name, kind, dims, start + offset, self.file) for name, kind, dims, offset in entries]
        self._buffer.release()

    def _take(self, size: int) -> memoryview:
        view = self._buffer[self._at : self._at + size]
        if len(view) != size:
            raise ValueError(f"{self.path}: the file ends inside its header")
        self._at += size
        return view

    def _unpack(self, layout: str) -> int:
        return struct.unpack(layout, self._take(struct.calcsize(layout)))[0]

    def _string(self) -> str:
        return bytes(self._take(self._unpack("<Q"))).decode("utf-8")

    def _skip(self, kind: int) -> None:
        if kind in FIXED_SIZES:
            self._take(FIXED_SIZES[kind])
        elif kind == STRING:
            self._take(self._unpack("<Q"))
        elif kind == ARRAY:
            item, count = self._unpack("<I"), self._unpack("<Q")
            if item in FIXED_SIZES:
                self._take(FIXED_SIZES[item] * count)
            elif item == STRING:  # a vocabulary: 300,000 strings in Qwen2.5's, walked by their lengths alone
                at, length = self._at, _LENGTH.unpack_from
                try:
                    for _ in range(count):
                        at += 8 + length(self._buffer, at)[0]
                except struct.error:
                    raise ValueError(f"{self.path}: the file ends inside its header") from None
                self._take(at - self._at)
            else:
                for _ in range(count):
                    self._skip(item)
        else:
            raise ValueError(f"{self.path}: unknown GGUF metadata type {kind}")
