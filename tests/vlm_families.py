"""Tiny random vision-language models, saved as a user's model folder: one entry per family issue 54 serves.

Each entry writes config.json, seeded random safetensors weights (``INIT_STD``, so that the image changes the
greedy tokens), generation_config.json, a byte-level tokenizer built here (no hub access: 256 byte tokens plus the
special tokens the family's processor needs), the processor's own configs and a short chat_template.jinja that
places the family's image marker where a ``{"type": "image"}`` part is. Text models: 2 layers, hidden 64; vision
towers: 1-2 layers on 32 px tiles. ``hf_generate`` is the reference the equivalence tests compare against.

What the processor returns besides input_ids / attention_mask / pixel_values (what an engine that splices image
features into ``inputs_embeds`` must carry), for one 64x48 image (``make_image``'s default):
- llava: nothing; 16 ``<image>`` per image (4x4 patches, CLS dropped: vision_feature_layer -2, "default" strategy).
- qwen2_vl / qwen2_5_vl: ``image_grid_thw`` (1, 6, 10) and ``mm_token_type_ids``; ``<|vision_start|>`` + 15
  ``<|image_pad|>`` + ``<|vision_end|>``; pixel_values are flattened patches (60, 3*2*7*7); the text model's 3-D
  M-RoPE positions come from the grid (``model.model.get_rope_index``), so the positions after an image are not
  its token count. Qwen2.5-VL's vision tower adds windowed attention (window 28 px here).
- gemma3: ``token_type_ids`` (1 on image tokens); ``\\n\\n<start_of_image>`` + 16 ``<image_soft_token>`` +
  ``<end_of_image>\\n\\n``; image tokens attend to each other bidirectionally (the mask is built from
  token_type_ids), so a prefill must see an image's tokens in one chunk. Sliding window 64 on layer 0.
- idefics3 / smolvlm: ``pixel_attention_mask`` (1, tiles, 32, 32); the image is split into 2x2 tiles of 32 px
  plus a global view (pixel_values (1, 5, 3, 32, 32)), each tile ``<fake_token_around_image><row_r_col_c>`` + 4
  ``<image>`` (``\\n`` after each row), then ``\\n<fake_token_around_image><global-img>`` + 4 ``<image>`` +
  ``<fake_token_around_image>``: 20 ``<image>`` among 34 tokens per image.
- git: nothing besides pixel_values; no placeholder tokens: the 17 image embeddings (16 patches + CLS) are prepended
  to the text inside the model, bidirectional among themselves, seen by every text token; the chat template renders
  text only (GIT is a captioner) and the tokenizer prefixes ``[CLS]``. Loads with ``AutoModelForImageTextToText``
  (GitForCausalLM, also ``AutoModelForCausalLM``).

Qwen2-VL, Qwen2.5-VL and SmolVLM processors hold a video processor, which transformers builds only where torchvision
imports (``needs_torchvision``); elsewhere their folders are written without it and loaded as the server loads
them (``decoding.model.vision_tower.load_processor``: the processor built from its parts with no video
processor), which is what a user without torchvision runs. Where torchvision imports, every image processor here
loads as its torchvision backend, elsewhere as its PIL one: their resizes differ, so the pixels (and greedy tokens)
do too; a reference and the engine must use the same one.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import transformers
from PIL import Image
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

from decoding.model.vision_tower import images_only_processor, load_processor
from tests.arch_families import INIT_STD

HIDDEN = 64
TEXT = dict(hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
TEXT.update(max_position_embeddings=512, tie_word_embeddings=False)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2)


def make_image(seed: int, size: tuple[int, int] = (64, 48)) -> Image.Image:
    """A seeded random RGB image of ``size`` (width, height)."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")


def _template(bos: str, turn: str, image: str, end: str, generation: str) -> str:
    """A chat template: string or parts content, the image marker in place of each image part."""
    content = (
        "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
        "{% if p['type'] == 'image' %}" + image + "{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
        "{% endfor %}{% endif %}"
    )
    return (
        bos + "{% for m in messages %}" + turn + content + end + "{% endfor %}"
        "{% if add_generation_prompt %}" + generation + "{% endif %}"
    )


_IM = dict(turn="<|im_start|>{{ m['role'] }}\n", end="<|im_end|>\n", generation="<|im_start|>assistant\n")
_IDEFICS_TURN = dict(turn="{{ m['role'] | capitalize }}:", image="<image>", end="<end_of_utterance>\n")
_IDEFICS_TURN["generation"] = "Assistant:"


Ids = Callable[[str], int]  # token -> id in the family's tokenizer


@dataclass(frozen=True)
class VlmFamily:
    """One family: the special tokens its processor needs, its config, its processor and its chat template."""

    name: str  # the model_type
    specials: str  # space-separated special tokens, ids 0..n-1; the 256 byte tokens follow
    roles: str  # "bos_token=<s> eos_token=</s> ...": the tokenizer's named tokens (image_token and kin included)
    config: Callable[[Ids, int], transformers.PretrainedConfig]  # (token -> id, vocabulary size) -> config
    processor: Callable[[transformers.PreTrainedTokenizerFast], transformers.ProcessorMixin]
    chat_template: str
    image_tokens: int  # placeholders for one ``make_image()`` (64x48); 0 for GIT, which prepends its features
    extras: frozenset[str] = frozenset()  # processor outputs besides input_ids, attention_mask, pixel_values
    prefix: str | None = None  # a token the tokenizer puts before every text (Llama's <s>, BERT's [CLS])
    needs_torchvision: bool = False

    @property
    def model_type(self) -> str:
        return self.name

    @property
    def named(self) -> dict[str, str]:
        return dict(pair.split("=", 1) for pair in self.roles.split())

    @property
    def image_token(self) -> str | None:
        """The placeholder the processor repeats per image; None for GIT."""
        return self.named.get("image_token")

    def tokenizer(self) -> transformers.PreTrainedTokenizerFast:
        specials = self.specials.split()
        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
        tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate([*specials, *alphabet])}, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens(specials)  # never split by the byte-level pre-tokenizer
        if self.prefix:
            tok.post_processor = processors.TemplateProcessing(
                single=f"{self.prefix} $A", special_tokens=[(self.prefix, specials.index(self.prefix))]
            )
        named = {k: v for k, v in self.named.items() if k in ("bos_token", "eos_token", "pad_token")}
        extra = {k: v for k, v in self.named.items() if k not in named}
        return transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, **named, extra_special_tokens=extra or specials
        )

    def build(self, seed: int = 0) -> tuple[torch.nn.Module, transformers.ProcessorMixin]:
        """The model (seeded weights of std ``INIT_STD``, untied head) and its processor."""
        tokenizer = self.tokenizer()
        config = self.config(tokenizer.convert_tokens_to_ids, len(tokenizer))
        model = transformers.AutoModelForImageTextToText.from_config(config, dtype=torch.float32).eval()
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            # transformers' std 0.02 makes a tiny model ignore its input; wide weights make every position count
            for param in model.parameters():
                if param.dim() > 1:
                    param.copy_(torch.randn(param.shape, generator=generator) * INIT_STD)
        ids = {
            f"{k}_id": tokenizer.convert_tokens_to_ids(self.named[k]) for k in ("bos_token", "eos_token", "pad_token")
        }
        model.generation_config = transformers.GenerationConfig(**ids)
        processor = self.processor(tokenizer)
        processor.chat_template = self.chat_template
        return model, processor

    def save(self, folder: str | Path, seed: int = 0) -> Path:
        """Write the model folder as ``save_pretrained`` does; returns it. A processor built without its video
        processor (no torchvision here) cannot ``save_pretrained``: its parts are written as it would write them."""
        model, processor = self.build(seed)
        model.save_pretrained(folder)
        if isinstance(processor.video_processor if self.needs_torchvision else None, SimpleNamespace):
            processor.tokenizer.save_pretrained(folder)
            processor.image_processor.save_pretrained(folder)
            (Path(folder) / "chat_template.jinja").write_text(processor.chat_template)
            settings = {"processor_class": type(processor).__name__, **self.processor_settings}
            (Path(folder) / "processor_config.json").write_text(json.dumps(settings))
        else:
            processor.save_pretrained(folder)
        return Path(folder)

    @property
    def processor_settings(self) -> dict[str, Any]:
        """What the processor's config holds besides its parts (SmolVLM's image_seq_len)."""
        return {"image_seq_len": 4} if self.name == "smolvlm" else {}


def _lm(tid: Ids, vocab: int, bos: str, eos: str, pad: str, **kwargs: Any) -> dict[str, Any]:
    """The text model's shape and ids."""
    ids = dict(bos_token_id=tid(bos), eos_token_id=tid(eos), pad_token_id=tid(pad))
    return dict(TEXT, vocab_size=vocab, **ids, **kwargs)


def _llava(tid: Ids, vocab: int) -> transformers.PretrainedConfig:
    return transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(**VISION, image_size=32, patch_size=8, projection_dim=32),
        text_config=transformers.LlamaConfig(**_lm(tid, vocab, "<s>", "</s>", "<pad>")),
        image_token_index=tid("<image>"),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        image_seq_length=16,
        tie_word_embeddings=False,
    )


def _qwen_vl(name: str, **vision: Any) -> Callable[[Ids, int], transformers.PretrainedConfig]:
    def make(tid: Ids, vocab: int) -> transformers.PretrainedConfig:
        rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}  # head_dim 16
        text = _lm(tid, vocab, "<|endoftext|>", "<|im_end|>", "<|endoftext|>", rope_parameters=rope)
        tower = dict(vision, depth=2, num_heads=2, patch_size=7, spatial_merge_size=2, temporal_patch_size=2)
        return getattr(transformers, name)(
            text_config=text,
            vision_config=tower,
            image_token_id=tid("<|image_pad|>"),
            video_token_id=tid("<|video_pad|>"),
            vision_start_token_id=tid("<|vision_start|>"),
            vision_end_token_id=tid("<|vision_end|>"),
            tie_word_embeddings=False,
        )

    return make


def _qwen_processor(name: str) -> Callable[[transformers.PreTrainedTokenizerFast], transformers.ProcessorMixin]:
    def make(tokenizer: transformers.PreTrainedTokenizerFast) -> transformers.ProcessorMixin:
        size = {"shortest_edge": 14 * 14 * 4, "longest_edge": 64 * 64}
        pixels = dict(size=size, patch_size=7, merge_size=2, temporal_patch_size=2)
        image = transformers.Qwen2VLImageProcessor(**pixels)
        if not torchvision_imports():
            return images_only_processor(getattr(transformers, name), image, tokenizer, {})
        video = transformers.Qwen2VLVideoProcessor(**pixels)
        return getattr(transformers, name)(image_processor=image, video_processor=video, tokenizer=tokenizer)

    return make


def _gemma3(tid: Ids, vocab: int) -> transformers.PretrainedConfig:
    layers = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=64)
    text = _lm(tid, vocab, "<bos>", "<end_of_turn>", "<pad>", head_dim=16, query_pre_attn_scalar=16, **layers)
    return transformers.Gemma3Config(
        text_config=transformers.Gemma3TextConfig(**text),
        vision_config=transformers.SiglipVisionConfig(**VISION, image_size=32, patch_size=4),
        mm_tokens_per_image=16,
        boi_token_index=tid("<start_of_image>"),
        eoi_token_index=tid("<end_of_image>"),
        image_token_index=tid("<image_soft_token>"),
        tie_word_embeddings=False,
    )


def _gemma3_processor(tokenizer: transformers.PreTrainedTokenizerFast) -> transformers.ProcessorMixin:
    image = transformers.Gemma3ImageProcessor(size={"height": 32, "width": 32})
    return transformers.Gemma3Processor(image_processor=image, tokenizer=tokenizer, image_seq_length=16)


def _idefics(config: str, vision: str) -> Callable[[Ids, int], transformers.PretrainedConfig]:
    def make(tid: Ids, vocab: int) -> transformers.PretrainedConfig:
        return getattr(transformers, config)(
            vision_config=getattr(transformers, vision)(
                **dict(VISION, num_hidden_layers=1, image_size=32, patch_size=8)
            ),
            text_config=transformers.LlamaConfig(**_lm(tid, vocab, "<|begin_of_text|>", "<end_of_utterance>", "<pad>")),
            image_token_id=tid("<image>"),
            scale_factor=2,
            tie_word_embeddings=False,
        )

    return make


_TILES = dict(size={"longest_edge": 64}, max_image_size={"longest_edge": 32}, do_image_splitting=True)


def _idefics3_processor(tokenizer: transformers.PreTrainedTokenizerFast) -> transformers.ProcessorMixin:
    image = transformers.Idefics3ImageProcessor(**_TILES)
    return transformers.Idefics3Processor(image_processor=image, tokenizer=tokenizer, image_seq_len=4)


def _smolvlm_processor(tokenizer: transformers.PreTrainedTokenizerFast) -> transformers.ProcessorMixin:
    image = transformers.SmolVLMImageProcessor(**_TILES)
    if not torchvision_imports():
        return images_only_processor(transformers.SmolVLMProcessor, image, tokenizer, {}, image_seq_len=4)
    video = transformers.SmolVLMVideoProcessor(size={"longest_edge": 32}, max_image_size={"longest_edge": 32})
    kwargs = dict(image_processor=image, video_processor=video, tokenizer=tokenizer, image_seq_len=4)
    return transformers.SmolVLMProcessor(**kwargs)


def _git(tid: Ids, vocab: int) -> transformers.PretrainedConfig:
    text = {k: v for k, v in _lm(tid, vocab, "[CLS]", "[SEP]", "[PAD]").items() if k != "num_key_value_heads"}
    return transformers.GitConfig(vision_config=dict(VISION, num_hidden_layers=1, image_size=32, patch_size=8), **text)


def _clip_processor(tokenizer: transformers.PreTrainedTokenizerFast, cls: str, **kwargs: Any) -> Any:
    image = transformers.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return getattr(transformers, cls)(image_processor=image, tokenizer=tokenizer, **kwargs)


_LLAVA = dict(patch_size=8, vision_feature_select_strategy="default", num_additional_image_tokens=1)
_QWEN = "<|endoftext|> <|im_start|> <|im_end|> <|vision_start|> <|vision_end|> <|image_pad|> <|video_pad|>"
_QWEN_ROLES = "bos_token=<|endoftext|> eos_token=<|im_end|> pad_token=<|endoftext|> image_token=<|image_pad|>"
_QWEN_TEMPLATE = _template("", image="<|vision_start|><|image_pad|><|vision_end|>", **_IM)
_QWEN_EXTRAS = frozenset({"image_grid_thw", "mm_token_type_ids"})
_QWEN25_VISION = dict(hidden_size=32, intermediate_size=64, out_hidden_size=HIDDEN, window_size=28)
_GEMMA = "<pad> <eos> <bos> <start_of_turn> <end_of_turn> <start_of_image> <end_of_image> <image_soft_token>"
_GEMMA_ROLES = "bos_token=<bos> eos_token=<end_of_turn> pad_token=<pad> boi_token=<start_of_image> " + (
    "eoi_token=<end_of_image> image_token=<image_soft_token>"
)
_GEMMA_TURN = "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
_GEMMA_TEMPLATE = _template("<bos>", _GEMMA_TURN, "<start_of_image>", "<end_of_turn>\n", "<start_of_turn>model\n")
_IDEFICS = "<pad> <|begin_of_text|> <end_of_utterance> <fake_token_around_image> <image> <global-img> " + " ".join(
    f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)
)
_IDEFICS_ROLES = "eos_token=<end_of_utterance> pad_token=<pad> image_token=<image>"
_SMOL_ROLES = " fake_image_token=<fake_token_around_image> end_of_utterance_token=<end_of_utterance> " + (
    "global_image_token=<global-img>"
)
_TILE_EXTRAS = frozenset({"pixel_attention_mask"})

VLM_FAMILIES: list[VlmFamily] = [
    VlmFamily(
        "llava",
        "<pad> <s> </s> <image>",
        "bos_token=<s> eos_token=</s> pad_token=<pad> image_token=<image>",
        _llava,
        functools.partial(_clip_processor, cls="LlavaProcessor", **_LLAVA),
        _template("", "{{ m['role'].upper() }}: ", "<image>\n", " ", "ASSISTANT:"),
        image_tokens=16,
        prefix="<s>",
    ),
    VlmFamily(
        "qwen2_vl",
        _QWEN,
        _QWEN_ROLES,
        _qwen_vl("Qwen2VLConfig", embed_dim=32, hidden_size=HIDDEN),
        _qwen_processor("Qwen2VLProcessor"),
        _QWEN_TEMPLATE,
        image_tokens=15,
        extras=_QWEN_EXTRAS,
        needs_torchvision=True,
    ),
    VlmFamily(
        "qwen2_5_vl",
        _QWEN,
        _QWEN_ROLES,
        _qwen_vl("Qwen2_5_VLConfig", **_QWEN25_VISION, fullatt_block_indexes=[1]),
        _qwen_processor("Qwen2_5_VLProcessor"),
        _QWEN_TEMPLATE,
        image_tokens=15,
        extras=_QWEN_EXTRAS,
        needs_torchvision=True,
    ),
    VlmFamily(
        "gemma3",
        _GEMMA,
        _GEMMA_ROLES,
        _gemma3,
        _gemma3_processor,
        _GEMMA_TEMPLATE,
        image_tokens=16,
        extras=frozenset({"token_type_ids"}),
    ),
    VlmFamily(
        "idefics3",
        _IDEFICS,
        "bos_token=<|begin_of_text|> " + _IDEFICS_ROLES,
        _idefics("Idefics3Config", "Idefics3VisionConfig"),
        _idefics3_processor,
        _template("<|begin_of_text|>", **_IDEFICS_TURN),
        image_tokens=20,
        extras=_TILE_EXTRAS,
    ),
    VlmFamily(
        "smolvlm",
        "<|im_start|> <video> " + _IDEFICS,
        "bos_token=<|im_start|> " + _IDEFICS_ROLES + _SMOL_ROLES,
        _idefics("SmolVLMConfig", "SmolVLMVisionConfig"),
        _smolvlm_processor,
        _template("<|im_start|>", **_IDEFICS_TURN),
        image_tokens=20,
        extras=_TILE_EXTRAS,
        needs_torchvision=True,
    ),
    VlmFamily(
        "git",
        "[PAD] [CLS] [SEP]",
        "bos_token=[CLS] eos_token=[SEP] pad_token=[PAD]",
        _git,
        functools.partial(_clip_processor, cls="GitProcessor"),
        _template("", "", "", "", ""),  # a captioner: the text parts only
        image_tokens=0,
        prefix="[CLS]",
    ),
]
BY_NAME = {family.name: family for family in VLM_FAMILIES}


@functools.cache
def torchvision_imports() -> bool:
    """Whether torchvision imports here (a torchvision wheel built for another torch fails at import)."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        return False
    return True


@functools.lru_cache(maxsize=8)
def load(folder: str) -> tuple[transformers.ProcessorMixin, torch.nn.Module]:
    """The folder's processor and model, as a user loads them (cached: the equivalence tests call this often);
    the processor as the server loads it (transformers' own, or without its video processor where torchvision
    does not import)."""
    processor = load_processor(folder)
    model = transformers.AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    return processor, model


def hf_inputs(folder: str | Path, messages: list[dict], images: list[Image.Image]) -> transformers.BatchFeature:
    """The rendered prompt tokenized with its images, as processor.apply_chat_template(tokenize=True) does it."""
    processor, _ = load(str(folder))
    # GitProcessor takes no chat template (transformers drops it at load): the tokenizer's is the same file
    render = processor if processor.chat_template else processor.tokenizer
    prompt = render.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    bos = processor.tokenizer.bos_token
    # HF's own rule: a prompt that starts with bos gets no special tokens added
    special = not (bos is not None and prompt.startswith(bos))
    return processor(text=prompt, images=images or None, add_special_tokens=special, return_tensors="pt")


def hf_generate(
    folder: str | Path, messages: list[dict], images: list[Image.Image], **generate_kwargs: Any
) -> list[int]:
    """transformers' own answer: the new tokens of ``model.generate`` on the rendered prompt and its images."""
    _, model = load(str(folder))
    inputs = hf_inputs(folder, messages, images)
    with torch.no_grad():
        out = model.generate(**inputs, **generate_kwargs)
    return out[0, inputs["input_ids"].shape[1] :].tolist()
