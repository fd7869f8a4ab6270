"""The vision benchmark's model: a LLaVA folder big enough for CPU timings to mean something, built once.

Random weights (seeded): figures of speed need the real shapes, not trained weights. The language model has
SmolLM2-135M's shape (LlamaConfig: hidden 576, 30 layers, 9 heads, 3 KV heads, intermediate 1536, tied
embeddings, SmolLM2's vocabulary plus ``<image>``); the vision tower is CLIP ViT-B/16 at 224 px (12 layers,
hidden 768, 12 heads, patch 16: 196 image tokens once the CLS token is dropped). The tokenizer is SmolLM2's,
read from the packaged GGUF's metadata (``decoding.model.gguf_metadata``: offline), with ``<image>`` added as a
special token; the processor is LlavaProcessor with a CLIPImageProcessor (its PIL backend where torchvision does
not import); the chat template is ChatML placing ``<image>\\n`` where an image part stands
(``tests.vlm_families``' template builder). The folder lives under ``~/.cache/decoda/bench-vlm/`` and is written
only when missing (under a temporary name, then renamed), so later runs load the same weights.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch
import transformers

from tests.vlm_families import _IM, _template

CACHE = Path.home() / ".cache" / "decoda"
FOLDER = CACHE / "bench-vlm" / "llava-smollm2-135m-clip-b16-224"
IMAGE_SIZE, PATCH = 224, 16
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2  # 196: CLS dropped ("default" strategy)
IMAGE_TOKEN = "<image>"
TITLE = "LLaVA: SmolLM2-135M's text shape, SmolLM2's tokenizer, CLIP ViT-B/16 at 224 px; random weights, seed 0"
CHAT_TEMPLATE = _template("", image=IMAGE_TOKEN + "\n", **_IM)
SMOLLM2_TEXT = dict(
    hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
    max_position_embeddings=8192, rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
    rms_norm_eps=1e-5, tie_word_embeddings=True,
)  # fmt: skip
CLIP_B16 = dict(
    hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, image_size=IMAGE_SIZE,
    patch_size=PATCH, projection_dim=512,
)  # fmt: skip


def smollm2_tokenizer(cache_root: Path = CACHE) -> transformers.PreTrainedTokenizerBase:
    """SmolLM2's tokenizer from the packaged GGUF's metadata (written once into Decoda's cache), plus ``<image>``."""
    from decoding.model.gguf_metadata import metadata_folder
    from loadtests.compare import smollm2_gguf

    folder = metadata_folder("smollm2-135m-instruct", smollm2_gguf(), cache_root)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, extra_special_tokens={"image_token": IMAGE_TOKEN})
    if tokenizer.convert_tokens_to_ids(IMAGE_TOKEN) == tokenizer.unk_token_id:
        raise RuntimeError(f"{IMAGE_TOKEN} was not added to the tokenizer read from {folder}")
    return tokenizer


def llava_config(tokenizer: transformers.PreTrainedTokenizerBase) -> transformers.LlavaConfig:
    """SmolLM2-135M's text shape behind CLIP ViT-B/16, the ids taken from ``tokenizer``."""
    ids = {f"{k}_token_id": tokenizer.convert_tokens_to_ids(getattr(tokenizer, f"{k}_token")) for k in ("bos", "eos")}
    text = transformers.LlamaConfig(**SMOLLM2_TEXT, vocab_size=len(tokenizer), pad_token_id=ids["eos_token_id"], **ids)
    return transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(**CLIP_B16),
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        image_seq_length=IMAGE_TOKENS,
        tie_word_embeddings=True,
    )


def llava_processor(tokenizer: transformers.PreTrainedTokenizerBase) -> transformers.LlavaProcessor:
    image = transformers.CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    return transformers.LlavaProcessor(
        image_processor=image, tokenizer=tokenizer, patch_size=PATCH, vision_feature_select_strategy="default",
        num_additional_image_tokens=1, chat_template=CHAT_TEMPLATE,
    )  # fmt: skip


def write_folder(out: Path, seed: int = 0, cache_root: Path = CACHE) -> Path:
    """config, seeded random safetensors, generation config, tokenizer, processor and chat template into ``out``."""
    tokenizer = smollm2_tokenizer(cache_root)
    config = llava_config(tokenizer)
    torch.manual_seed(seed)
    model = transformers.AutoModelForImageTextToText.from_config(config, dtype=torch.float32).eval()
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=config.text_config.bos_token_id, eos_token_id=config.text_config.eos_token_id,
        pad_token_id=config.text_config.pad_token_id,
    )  # fmt: skip
    model.save_pretrained(out)
    llava_processor(tokenizer).save_pretrained(out)
    return out


def bench_folder(folder: Path = FOLDER, seed: int = 0) -> Path:
    """The benchmark's LLaVA folder, built the first time (a minute or so) and reused after."""
    if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        print(f"building the benchmark's LLaVA folder once: {folder}", flush=True)
        write_folder(tmp, seed)
        tmp.chmod(0o755)
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
