"""A vision-language folder whose processor transformers cannot build here is refused with the reason.

Qwen2-VL's processor holds a video processor that transformers builds only where torchvision imports; a user
serving such a folder without it gets a start-up error naming the missing library, not a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers

from decoding.model.registry import ModelLoadError
from decoding.model.vision_tower import load_processor
from tests.vlm_families import BY_NAME, torchvision_imports


@pytest.mark.skipif(torchvision_imports(), reason="torchvision imports here: the processor builds")
def test_a_processor_that_needs_torchvision_is_refused_with_the_reason(tmp_path: Path) -> None:
    family = BY_NAME["qwen2_vl"]
    tokenizer = family.tokenizer()
    tokenizer.save_pretrained(tmp_path)
    pixels = dict(size={"shortest_edge": 784, "longest_edge": 4096}, patch_size=7, merge_size=2, temporal_patch_size=2)
    transformers.Qwen2VLImageProcessor(**pixels).save_pretrained(tmp_path)
    (tmp_path / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2VLProcessor"}))
    with pytest.raises(ModelLoadError, match="cannot be built here: Qwen2VLVideoProcessor requires the Torchvision"):
        load_processor(str(tmp_path))


def test_a_buildable_processor_loads(tmp_path: Path) -> None:
    folder = BY_NAME["llava"].save(tmp_path)
    assert isinstance(load_processor(str(folder)), transformers.LlavaProcessor)
