"""A vision-language model's image side: its vision tower and projector, run on a prompt's images.

Every family transformers serves through ``AutoModelForImageTextToText`` exposes the same entry,
``get_image_features(**pixel_inputs, return_dict=True).pooler_output``: the features its forward
scatters into the placeholder positions, per image (a list: LLaVA, Qwen2-VL) or as one tensor
(Gemma 3's ``[images, tokens, hidden]``, Idefics3's ``[tiles, tokens, hidden]``). Flattened in order they
are what ``masked_scatter`` writes, token for token, so calling it with the processor's own outputs gives
the features ``generate()`` computes, whatever the family. GIT has no such entry: its image encoder and projection
are called as ``GitModel`` calls them (``git_forward.git_image_features``).
"""

from __future__ import annotations

import inspect
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from decoding.model.git_forward import git_image_features
from decoding.vision.git_prompt import is_git

_log = logging.getLogger(__name__)


def takes_images(config: Any) -> bool:
    """A vision-language model: its config has a vision tower's."""
    return getattr(config, "vision_config", None) is not None


def vision_attention(text_attention: str | None, config: Any = None) -> dict[str, str | None] | str | None:  # noqa: ANN401
    """The ``attn_implementation`` of a vision-language model: ``text_attention`` for its language model
    (Decoda's paged attention), and transformers' SDPA for the rest (the vision tower, as ``generate()``
    runs it by default: its features are then the same). GIT takes eager attention only, as ``generate()``
    runs it: its text attention is routed to Decoda's by ``git_forward.route_attention`` instead."""
    if text_attention is None:
        return None
    if config is not None and is_git(config):
        return "eager"
    return {"text_config": text_attention, "vision_config": "sdpa", "": "sdpa"}


def load_processor(name_or_path: str) -> Any:  # noqa: ANN401
    """The model's processor (image processor, tokenizer, chat template), as transformers loads it.

    Some families' processors hold a video processor (Qwen2-VL, Qwen2.5-VL, SmolVLM) that transformers builds
    only where torchvision imports, and without it refuses to build the whole processor, images included. A
    CPU torch often comes without a matching torchvision (PyPI's wheel is built against CUDA's torch), and
    Decoda serves images, never videos; so there the processor is built from its parts with no video
    processor (``processor_without_videos``): the same class, image processor (its PIL backend, which
    transformers picks without torchvision), tokenizer, chat template and settings. What still cannot be
    built is refused at start with the reason instead of a traceback."""
    from transformers import AutoProcessor

    from decoding.model.registry import ModelLoadError

    try:
        return AutoProcessor.from_pretrained(name_or_path)
    except ImportError as error:
        try:
            built = processor_without_videos(name_or_path)
        except ImportError:
            built = None
        if built is not None:
            _log.warning("%s: its processor's video processor needs torchvision, which does not import here; "
                         "serving images with the processor built without it", name_or_path)  # fmt: skip
            return built
        reason = " ".join(str(error).split()).split(" Check out")[0]
        raise ModelLoadError(
            f"the processor of {name_or_path!r} cannot be built here: {reason} (transformers builds it only where "
            "that library imports; install the build matching this torch, e.g. torchvision from "
            "https://download.pytorch.org/whl/cpu for a CPU torch)"
        ) from error


def processor_without_videos(name_or_path: str) -> Any:  # noqa: ANN401
    """The folder's processor built from its parts with no video processor, where its class takes one (None
    for a class that does not: nothing to leave out)."""
    from transformers import AutoImageProcessor, AutoTokenizer

    cls = _processor_class(name_or_path)
    if cls is None or "video_processor" not in cls.get_attributes():
        return None
    settings, _ = cls.get_processor_dict(name_or_path)
    accepted = inspect.signature(cls.__init__).parameters
    parts = ("image_processor", "tokenizer", "video_processor")
    kwargs = {key: value for key, value in settings.items() if key in accepted and key not in parts}
    video = _json(Path(name_or_path) / "video_preprocessor_config.json")
    return images_only_processor(cls, AutoImageProcessor.from_pretrained(name_or_path),
                                 AutoTokenizer.from_pretrained(name_or_path), video, **kwargs)  # fmt: skip


def images_only_processor(cls: type, image_processor: Any, tokenizer: Any, video_settings: dict[str, Any],
                          **kwargs: Any) -> Any:  # noqa: ANN401  # fmt: skip
    """A processor of class ``cls`` without its video processor. ``ProcessorMixin`` checks each part's class,
    and a video processor's cannot even be looked up without torchvision, so the instance is of a subclass
    that lists its parts without it; what the class reads of its video processor when no video is given
    (SmolVLM's ``apply_chat_template``: num_frames, fps) comes from ``video_settings`` (the folder's video
    processor config). A video reaching it would fail; none does (chat image parts only)."""
    import transformers

    images_only = type(cls.__name__, (cls,), {"get_attributes": classmethod(_without_video_attribute)})
    processor = images_only(image_processor=image_processor, tokenizer=tokenizer, video_processor=None, **kwargs)
    processor.video_processor = SimpleNamespace(**{key: video_settings.get(key) for key in ("num_frames", "fps")})
    assert isinstance(processor, transformers.ProcessorMixin)
    return processor


def _without_video_attribute(cls: type) -> list[str]:
    return [name for name in super(cls, cls).get_attributes() if name != "video_processor"]


def _processor_class(name_or_path: str) -> type | None:
    """The processor class the folder names (its processor config), else its model type's."""
    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    path = Path(name_or_path)
    for file in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        named = _json(path / file).get("processor_class")
        if named:
            return getattr(transformers, named, None)
    model_type = _json(path / "config.json").get("model_type")
    name = PROCESSOR_MAPPING_NAMES.get(model_type) if model_type else None
    return getattr(transformers, name, None) if name else None


def _json(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


# inputs that stack along their first dimension into one tower call: images in a batch (LLaVA, Gemma 3:
# ``pixel_values`` [images, 3, H, W]) or patches of images listed by their grids (Qwen2-VL: ``pixel_values``
# [patches, dim] with ``image_grid_thw`` [images, 3]); Idefics3's per-prompt tiles are padded by the processor
# and do not
_STACKABLE = ({"pixel_values"}, {"pixel_values", "image_grid_thw"})


def stack_key(pixel_inputs: dict[str, torch.Tensor]) -> tuple | None:
    """What prompts whose images can share one tower call have in common (None: this one runs alone)."""
    if set(pixel_inputs) not in _STACKABLE:
        return None
    values = pixel_inputs["pixel_values"]
    if "image_grid_thw" not in pixel_inputs and values.dim() != 4:
        return None
    return tuple(sorted(pixel_inputs)), tuple(values.shape[1:]), values.dtype


def stacked(inputs: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Several prompts' inputs (of one ``stack_key``) as one call's."""
    if len(inputs) == 1:
        return inputs[0]
    return {name: torch.cat([one[name] for one in inputs]) for name in inputs[0]}


@torch.inference_mode()
def image_features(model: torch.nn.Module, pixel_inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[num_image_tokens, hidden]``: the features of every image of one prompt, in placeholder order."""
    inner = getattr(model, "model", model)
    device = next(model.parameters()).device
    dtype = next(inner.get_input_embeddings().parameters()).dtype
    inputs = {
        name: value.to(device, dtype) if value.is_floating_point() else value.to(device)
        for name, value in pixel_inputs.items()
    }
    if is_git(model.config):
        return git_image_features(model, inputs["pixel_values"])
    pooled = inner.get_image_features(**inputs, return_dict=True).pooler_output
    parts = pooled if isinstance(pooled, list | tuple) else [pooled]
    return torch.cat([part.reshape(-1, part.shape[-1]) for part in parts])
