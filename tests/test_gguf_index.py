"""The GGUF tensor table read without the metadata's values equals the ``gguf`` package's reader."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader

from decoding.model.quantization.gguf_index import GgufIndex
from decoding.model.registry import PACKAGED_MODELS, gguf_parts


@pytest.fixture(scope="module")
def smollm2_gguf() -> str:
    return str(gguf_parts(PACKAGED_MODELS["smollm2-135m-instruct"])[0])


def test_the_table_equals_the_gguf_readers(smollm2_gguf: str) -> None:
    reader, index = GGUFReader(smollm2_gguf), GgufIndex(smollm2_gguf)
    field = reader.fields["general.architecture"]
    assert index.architecture == bytes(field.parts[field.data[0]]).decode() == "llama"
    assert [t.name for t in index.tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(index.tensors, reader.tensors, strict=True):
        assert ours.tensor_type == theirs.tensor_type
        assert ours.dims == tuple(int(d) for d in theirs.shape)
        assert ours.data.shape == theirs.data.shape and ours.data.dtype == theirs.data.dtype
        assert np.array_equal(ours.data.view(np.uint8), np.asarray(theirs.data).view(np.uint8))


def test_a_file_that_is_not_gguf_or_ends_early_is_refused(tmp_path, smollm2_gguf: str) -> None:
    other = tmp_path / "weights.bin"
    other.write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF file"):
        GgufIndex(other)
    cut = tmp_path / "cut.gguf"
    with open(smollm2_gguf, "rb") as whole:
        cut.write_bytes(whole.read(4096))  # inside the tokenizer's strings
    with pytest.raises(ValueError, match="ends inside its header"):
        GgufIndex(cut)
