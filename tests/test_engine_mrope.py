"""Qwen2-VL and Qwen2.5-VL in the engine: their 3D M-RoPE positions, token-exact with ``generate()``.

The inputs are made here as their processor makes them, from its image processor alone (the whole processor
is tests/test_engine_vision.py's): ``<|vision_start|>``, one ``<|image_pad|>`` per
merged patch of the grid, ``<|vision_end|>``, and ``mm_token_type_ids`` marking the pads. The engine gets
the record ``build_image_prompt`` keeps (the positions ``get_rope_index`` gives, and the delta of the
tokens after them), ``generate()`` the same tensors.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers import GenerationMixin

from decoding.params import GenerationParams
from decoding.vision.prompt import build_image_prompt, image_digest
from tests import vlm_families as vf
from tests.engine_harness import EngineHarness

MAX_NEW = 10
MODES = {
    "greedy": {"do_sample": False},
    "beam": {"do_sample": False, "num_beams": 3, "num_return_sequences": 2},
    "sampling": {"do_sample": True, "temperature": 0.9, "top_p": 0.9},
}


class Qwen:
    def __init__(self, name: str) -> None:
        family = vf.BY_NAME[name]
        self.tokenizer = family.tokenizer()
        config = family.config(self.tokenizer.convert_tokens_to_ids, len(self.tokenizer))
        self.model = transformers.AutoModelForImageTextToText.from_config(config, dtype=torch.float32).eval()
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for param in self.model.parameters():
                if param.dim() > 1:
                    param.copy_(torch.randn(param.shape, generator=generator) * vf.INIT_STD)
        size = {"shortest_edge": 14 * 14 * 4, "longest_edge": 64 * 64}
        self.images = transformers.Qwen2VLImageProcessor(size=size, patch_size=7, merge_size=2, temporal_patch_size=2)
        self.eos = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.pad = self.tokenizer.convert_tokens_to_ids("<|image_pad|>")

    def inputs(self, text: str, seeds: list[int]) -> dict[str, torch.Tensor]:
        """What Qwen2VLProcessor gives for the text after its images."""
        pictures = [vf.make_image(seed) for seed in seeds]
        pixels = self.images(images=pictures, return_tensors="pt") if pictures else {"image_grid_thw": []}
        ids: list[int] = self.tokenizer.encode("<|im_start|>user\n", add_special_tokens=False)
        for grid in pixels["image_grid_thw"]:
            ids += [self.tokenizer.convert_tokens_to_ids("<|vision_start|>")]
            ids += [self.pad] * (int(grid.prod()) // 4)
            ids += [self.tokenizer.convert_tokens_to_ids("<|vision_end|>")]
        ids += self.tokenizer.encode(f"{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
        input_ids = torch.tensor([ids])
        text_only = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
        if not pictures:
            return text_only
        return {**text_only, "mm_token_type_ids": (input_ids == self.pad).int(), **pixels}

    def add(self, harness: EngineHarness, request_id: str, text: str, seeds: list[int], params) -> None:  # noqa: ANN001
        processed = self.inputs(text, seeds)
        digests = [image_digest(vf.make_image(seed)) for seed in seeds]
        ids, record = build_image_prompt(processed, self.model.config, digests, ["image"] * len(seeds),
                                         self.model.model.get_rope_index)  # fmt: skip
        harness.add(request_id, ids, params, image_prompt=record)

    def reference(self, text: str, seeds: list[int], mode: str, seed: int | None = None) -> list[list[int]]:
        if seed is not None:
            torch.manual_seed(seed)
        with torch.inference_mode():
            out = GenerationMixin.generate(self.model, **self.inputs(text, seeds), max_new_tokens=MAX_NEW, top_k=0,
                                           pad_token_id=self.eos, eos_token_id=self.eos, **MODES[mode])  # fmt: skip
        rows = out[:, self.inputs(text, seeds)["input_ids"].shape[1] :].tolist()
        return [row[: row.index(self.eos) + 1] if self.eos in row else row for row in rows]

    def harness(self, **kwargs: object) -> EngineHarness:
        return EngineHarness(self.model, self.tokenizer, [self.eos], max_model_len=512, **kwargs)


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def qwen(request) -> Qwen:
    return Qwen(request.param)


def params_for(mode: str, seed: int) -> GenerationParams:
    kwargs = MODES[mode]
    return GenerationParams(max_new_tokens=MAX_NEW, seed=seed if kwargs["do_sample"] else None,
                            n=kwargs.get("num_return_sequences", 1), **kwargs)  # fmt: skip


def test_the_prompt_rotates_by_its_grid_and_later_tokens_by_the_delta(qwen):
    processed = qwen.inputs("Hi", [1])
    _, record = build_image_prompt(processed, qwen.model.config, ["d"], ["image"], qwen.model.model.get_rope_index)
    assert record.rope.shape == (3, processed["input_ids"].shape[1])
    assert not torch.equal(record.rope[1], record.rope[2])  # height and width differ inside the image
    assert record.rope_delta < 0  # an image's tokens take fewer positions than tokens


@pytest.mark.parametrize("mode", sorted(MODES))
def test_each_mode_alone_equals_generate(qwen, mode):
    harness = qwen.harness()
    params = params_for(mode, 5)
    qwen.add(harness, "r", "Describe it.", [3], params)
    harness.run()
    expected = qwen.reference("Describe it.", [3], mode, seed=5 if params.do_sample else None)
    assert [harness.token_ids("r", i) for i in range(params.n)] == expected


def test_mixed_with_text_and_two_image_requests_each_equal_generate(qwen):
    cases = [("One", [6]), ("Two", [7, 8]), ("Three", []), ("Four", [9])]
    harness = qwen.harness(max_num_batched_tokens=24)
    for i, (text, seeds) in enumerate(cases):
        if seeds:
            qwen.add(harness, str(i), text, seeds, params_for("greedy", 0))
        else:
            harness.add(str(i), qwen.inputs(text, [])["input_ids"][0].tolist(), params_for("greedy", 0))
    harness.run()
    for i, (text, seeds) in enumerate(cases):
        assert harness.token_ids(str(i)) == qwen.reference(text, seeds, "greedy")[0], i
