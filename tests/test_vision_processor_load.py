"""A vision-language folder's processor where transformers cannot build it whole.

Qwen2-VL's, Qwen2.5-VL's and SmolVLM's processors hold a video processor that transformers builds only where
torchvision imports, and without it transformers refuses the whole processor, images included. The server
then builds it from its parts without the video processor (Decoda serves images, never videos); a part it
cannot do without is refused at start with the reason, not a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from decoding.model.registry import ModelLoadError
from decoding.model.vision_tower import load_processor
from tests.vlm_families import BY_NAME, make_image, torchvision_imports

PIXELS = dict(size={"shortest_edge": 784, "longest_edge": 4096}, patch_size=7, merge_size=2, temporal_patch_size=2)


def qwen2_vl_parts(folder: Path) -> Path:
    """A Qwen2-VL processor's files with no video processor config: tokenizer, image processor, processor config."""
    BY_NAME["qwen2_vl"].tokenizer().save_pretrained(folder)
    transformers.Qwen2VLImageProcessor(**PIXELS).save_pretrained(folder)
    (folder / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2VLProcessor"}))
    return folder


@pytest.mark.skipif(torchvision_imports(), reason="torchvision imports here: transformers builds the processor whole")
def test_a_processor_whose_video_part_needs_torchvision_serves_images_without_it(tmp_path: Path, caplog) -> None:
    processor = load_processor(str(qwen2_vl_parts(tmp_path)))
    assert isinstance(processor, transformers.Qwen2VLProcessor) and "without it" in caplog.text
    image = make_image(3)
    text = "<|vision_start|><|image_pad|><|vision_end|>What is this?"
    ours = processor(text=text, images=[image], return_tensors="pt")
    alone = transformers.Qwen2VLImageProcessor(**PIXELS)(images=[image], return_tensors="pt")
    assert torch.equal(ours["pixel_values"], alone["pixel_values"])
    placeholders = int(alone["image_grid_thw"].prod()) // 4  # one per merged 2x2 patch, as the processor lays out
    image_pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert ours["input_ids"][0].tolist().count(image_pad) == placeholders


def test_a_part_that_cannot_be_built_is_refused_with_the_reason(tmp_path: Path, monkeypatch) -> None:
    folder = qwen2_vl_parts(tmp_path)

    def needs_a_library(*args, **kwargs):
        raise ImportError("FancyImageProcessor requires the Fancy library but it was not found in your environment. "
                          "Check out the instructions on the installation page")  # fmt: skip

    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", needs_a_library)
    monkeypatch.setattr(transformers.AutoImageProcessor, "from_pretrained", needs_a_library)
    with pytest.raises(ModelLoadError, match="cannot be built here: FancyImageProcessor requires the Fancy library"):
        load_processor(str(folder))


def test_a_buildable_processor_loads(tmp_path: Path) -> None:
    folder = BY_NAME["llava"].save(tmp_path)
    assert isinstance(load_processor(str(folder)), transformers.LlavaProcessor)
