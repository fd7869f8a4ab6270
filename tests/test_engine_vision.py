"""Vision-language models in the engine: token-exact with ``generate()`` on each family's tiny model.

Each family's folder (``tests/vlm_families.py``) is loaded as the server loads it; the prompt is built by
``ImagePrompter`` (the model's processor through ``apply_chat_template``, as the engine client does) and
compared with the ids transformers' processor gives; the tokens with ``model.generate`` on the same
inputs: greedy, beam search, seeded sampling, two images in one message, a prompt without an image, alone
and 16 requests at once. The prefix cache keys image tokens by the image: a repeated image is served from
cache (no vision tower run), a different image behind the same text never is. GIT's image is no placeholder
of its text but the model's own prefix: its prompt starts with the image's positions, then the processor's
ids; it reads one image per prompt (two are a 400 naming the second).
"""

from __future__ import annotations

import io

import pytest
import torch
from transformers import GenerationMixin

from decoding.engine.image_prompts import ImagePrompter
from decoding.media import ImageInput
from decoding.params import GenerationParams, ParameterError
from tests import vlm_families as vf
from tests.engine_harness import EngineHarness

MAX_NEW = 10
SERVED = vf.VLM_FAMILIES
MODES = {
    "greedy": {"do_sample": False},
    "beam": {"do_sample": False, "num_beams": 3, "num_return_sequences": 2, "length_penalty": 0.8},
    "sampling": {"do_sample": True, "temperature": 0.9, "top_p": 0.9},
    "penalties": {"do_sample": False, "repetition_penalty": 1.3, "no_repeat_ngram_size": 2},
}


def png(image) -> bytes:  # noqa: ANN001
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


class Served:
    """One family's folder as the server holds it: its processor, model, and a prompter."""

    def __init__(self, family: vf.VlmFamily, folder: str) -> None:
        self.family, self.folder = family, folder
        self.processor, self.model = vf.load(folder)
        self.prompter = ImagePrompter(self.processor, self.model, max_pixels=4096 * 4096)
        self.eos = self.model.generation_config.eos_token_id

    def messages(self, text: str, num_images: int = 1) -> list[dict]:
        return [{"role": "user", "content": [*([{"type": "image"}] * num_images), {"type": "text", "text": text}]}]

    def prompt(self, text: str, seeds: list[int]):  # noqa: ANN201
        images = [ImageInput(png(vf.make_image(seed)), f"messages[0].content[{i}]") for i, seed in enumerate(seeds)]
        return self.prompter.prompt(self.messages(text, len(seeds)), images, chat_template=None, tools=None,
                                    add_generation_prompt=True, template_kwargs=None)  # fmt: skip

    def harness(self, **kwargs: object) -> EngineHarness:
        kwargs.setdefault("max_model_len", 512)
        return EngineHarness(self.model, self.processor.tokenizer, [self.eos], **kwargs)

    def reference(self, text: str, seeds: list[int], mode: str, seed: int | None = None) -> list[list[int]]:
        """``generate()``'s continuations, each cut after eos."""
        inputs = vf.hf_inputs(self.folder, self.messages(text, len(seeds)), [vf.make_image(s) for s in seeds])
        if seed is not None:
            torch.manual_seed(seed)
        kwargs = {"top_k": 0, **MODES[mode]}
        with torch.inference_mode():
            out = GenerationMixin.generate(self.model, **inputs, max_new_tokens=MAX_NEW, pad_token_id=self.eos,
                                           **kwargs)  # fmt: skip
        rows = out[:, inputs["input_ids"].shape[1] :].tolist()
        return [row[: row.index(self.eos) + 1] if self.eos in row else row for row in rows]


def params_for(mode: str, seed: int) -> GenerationParams:
    kwargs = dict(MODES[mode])
    n = kwargs.get("num_return_sequences", 1)
    return GenerationParams(max_new_tokens=MAX_NEW, seed=seed if kwargs["do_sample"] else None, n=n, **kwargs)


def ours(harness: EngineHarness, request_id: str, n: int = 1) -> list[list[int]]:
    return [harness.token_ids(request_id, index) for index in range(n)]


@pytest.fixture(scope="module", params=[f.name for f in SERVED])
def served(request, tmp_path_factory) -> Served:
    family = vf.BY_NAME[request.param]
    folder = family.save(tmp_path_factory.mktemp(family.name))
    return Served(family, str(folder))


def test_the_prompt_is_the_processors(served):
    prompt = served.prompt("What is this?", [1])
    expected = vf.hf_inputs(served.folder, served.messages("What is this?"), [vf.make_image(1)])
    record = prompt.media
    assert list(prompt)[record.text_start :] == expected["input_ids"][0].tolist()
    assert len(record.images) == 1 and record.positions.numel() >= served.family.image_tokens
    if served.family.name == "git":  # the image's 17 features (16 patches + CLS) first, attending both ways
        assert record.positions.tolist() == list(range(17)) and record.text_start == 17
        assert record.bidirectional == ((0, 17),) and list(prompt)[:17] == [served.model.config.pad_token_id] * 17
    else:
        assert record.text_start == 0


def test_a_prompt_without_an_image_equals_generate(served):
    harness = served.harness()
    prompt = served.prompter.prompt(served.messages("Only words.", 0), [], chat_template=None, tools=None,
                                    add_generation_prompt=True, template_kwargs=None)  # fmt: skip
    assert prompt.media is None
    harness.add("r", list(prompt), params_for("greedy", 0))
    harness.run()
    assert ours(harness, "r") == served.reference("Only words.", [], "greedy")


@pytest.mark.parametrize("mode", sorted(MODES))
def test_each_mode_alone_equals_generate(served, mode):
    harness = served.harness()
    prompt = served.prompt("Describe it.", [3])
    params = params_for(mode, 7)
    harness.add("r", list(prompt), params, image_prompt=prompt.media)
    harness.run()
    expected = served.reference("Describe it.", [3], mode, seed=7 if params.do_sample else None)
    assert ours(harness, "r", params.n) == expected


def test_two_images_in_one_message_equal_generate(served):
    if served.family.name == "git":  # GitModel puts one image's features before the text: two are refused
        with pytest.raises(ParameterError) as error:
            served.prompt("Compare them.", [4, 5])
        assert error.value.param == "messages[0].content[1]" and "one image" in str(error.value)
        return
    harness = served.harness()
    prompt = served.prompt("Compare them.", [4, 5])
    harness.add("r", list(prompt), params_for("greedy", 0), image_prompt=prompt.media)
    harness.run()
    assert ours(harness, "r") == served.reference("Compare them.", [4, 5], "greedy")


def test_sixteen_requests_at_once_each_equal_generate(served):
    """Image and text requests of every mode in one batch, with prompt chunks small enough to split them."""
    cases = [(f"Look {i}", [10 + i % 5], sorted(MODES)[i % len(MODES)]) for i in range(16)]
    harness = served.harness(max_num_batched_tokens=48)
    for i, (text, seeds, mode) in enumerate(cases):
        prompt = served.prompt(text, seeds)
        harness.add(str(i), list(prompt), params_for(mode, 100 + i), image_prompt=prompt.media)
    harness.run()
    for i, (text, seeds, mode) in enumerate(cases):
        params = params_for(mode, 100 + i)
        expected = served.reference(text, seeds, mode, seed=100 + i if params.do_sample else None)
        assert ours(harness, str(i), params.n) == expected, (i, mode)


def test_the_prefix_cache_keys_image_tokens_by_the_image(served, monkeypatch):
    """The same image again: served from cache, the vision tower not run; another image behind the same
    text: its own K/V and its own answer."""
    from decoding.engine import vision_stage

    runs = []
    real = vision_stage.image_features
    monkeypatch.setattr(vision_stage, "image_features", lambda *a: runs.append(1) or real(*a))
    harness = served.harness(block_size=4)
    first = served.prompt("Same text.", [21])
    harness.add("a", list(first), params_for("greedy", 0), image_prompt=first.media)
    harness.run()
    again = served.prompt("Same text.", [21])
    harness.add("b", list(again), params_for("greedy", 0), image_prompt=again.media)
    harness.run()
    other = served.prompt("Same text.", [22])
    harness.add("c", list(other), params_for("greedy", 0), image_prompt=other.media)
    harness.run()
    assert len(runs) == 2  # a and c; b's image tokens were all in the cache
    cached = [out.num_cached_tokens for out in harness.outputs["b"] if out.finished][0]
    last_image = int(again.media.positions.max())
    assert cached > last_image
    cached_c = [out.num_cached_tokens for out in harness.outputs["c"] if out.finished][0]
    assert cached_c <= int(other.media.positions.min())
    assert ours(harness, "b") == ours(harness, "a")
    assert ours(harness, "c") == served.reference("Same text.", [22], "greedy")


def test_a_prompt_with_the_image_token_but_no_image_is_refused(served):
    prompt = served.prompt("Hi", [1])
    with pytest.raises(ParameterError) as error:
        served.prompter.check(params_for("greedy", 0), [list(prompt)], "prompt")
    assert error.value.param == "prompt"
    served.prompter.check(params_for("greedy", 0), [prompt], "messages")  # with its images: fine


def test_preempted_image_requests_resume_and_equal_generate(served):
    """A pool too small for all at once: image requests give way (some half-way through their prompt, their
    features kept for the rest) and come back with the same answers."""
    from tests.test_engine_preemption import run_until_preempted

    cases = [(f"Tell {i}", [30 + i]) for i in range(4)]
    prompts = [served.prompt(text, seeds) for text, seeds in cases]
    longest = max(len(prompt) for prompt in prompts) + MAX_NEW
    # room for two prompts, not for their beams grown to full length (and for admitting one request: its prompt's
    # blocks and one per row of the default --max-num-seqs 16, which GIT's short prompts would not give)
    blocks = max(2 * -(-longest // 4) + 4, -(-longest // 4) + 16)
    harness = served.harness(max_model_len=longest, max_num_batched_tokens=16, kv_cache_blocks=blocks, block_size=4)
    for i, prompt in enumerate(prompts):
        harness.add(str(i), list(prompt), params_for("beam", 0), image_prompt=prompt.media)
    run_until_preempted(harness)
    harness.run()
    for i, (text, seeds) in enumerate(cases):
        assert ours(harness, str(i), 2) == served.reference(text, seeds, "beam"), i
    assert harness.engine.pool.blocks.num_used == 0 and all(m is None for m in harness.engine.pool.media)


def test_prompt_lookup_with_an_image_keeps_greedy_output(served):
    harness = served.harness()
    prompt = served.prompt("Repeat repeat repeat.", [40])
    harness.add("r", list(prompt), GenerationParams(max_new_tokens=MAX_NEW, do_sample=False,
                                                    prompt_lookup_num_tokens=3), image_prompt=prompt.media)  # fmt: skip
    harness.run()
    assert ours(harness, "r") == served.reference("Repeat repeat repeat.", [40], "greedy")


def test_images_that_break_the_tower_fail_their_request_alone(served):
    """Two prompts encoded in one call, one of them inconsistent (more image tokens than its images give): the
    call is retried prompt by prompt, that request fails, the other is answered."""
    harness = served.harness(max_num_batched_tokens=512)
    good, bad = served.prompt("Fine.", [50]), served.prompt("Broken.", [51])
    bad.media.positions = torch.cat([bad.media.positions, torch.tensor([len(bad) - 1])])
    harness.add("good", list(good), params_for("greedy", 0), image_prompt=good.media)
    harness.add("bad", list(bad), params_for("greedy", 0), image_prompt=bad.media)
    harness.run()
    assert ours(harness, "good") == served.reference("Fine.", [50], "greedy")
    assert "vision tower" in harness.outputs["bad"][-1].error


def test_an_assistant_sharing_the_tokenizer_keeps_greedy_output(served):
    """Speculative decoding: a text-only draft model over the same vocabulary drafts for an image request (its
    prompt holds the placeholder ids as text); the target verifies, so greedy's tokens stand."""
    from decoding.engine.core import Engine
    from tests.engine_harness import as_served, tiny_llama

    vocab = served.model.config.get_text_config().vocab_size
    harness = served.harness()
    engine = harness.engine
    harness.engine = Engine(engine.runner.model, served.processor.tokenizer, [served.eos], engine.limits,
                            harness._collect, torch.device("cpu"),
                            assistants={"draft": as_served(tiny_llama(vocab, seed=3))})  # fmt: skip
    prompt = served.prompt("Draft it.", [60])
    harness.add("r", list(prompt), GenerationParams(max_new_tokens=MAX_NEW, do_sample=False, assistant_model="draft",
                                                    num_assistant_tokens=3), image_prompt=prompt.media)  # fmt: skip
    harness.run()
    assert ours(harness, "r") == served.reference("Draft it.", [60], "greedy")


def test_contrastive_search_with_an_image_answers_the_same_alone_and_in_a_batch(served):
    """Contrastive search reads the rows' hidden states; with an image they come from the spliced features."""
    params = GenerationParams(max_new_tokens=MAX_NEW, penalty_alpha=0.6, top_k=4)
    answers = []
    for others in (0, 3):
        harness = served.harness()
        for i in range(others):
            extra = served.prompt(f"Other {i}", [70 + i])
            harness.add(f"o{i}", list(extra), params_for("greedy", 0), image_prompt=extra.media)
        prompt = served.prompt("Contrast.", [61])
        harness.add("r", list(prompt), params, image_prompt=prompt.media)
        harness.run()
        answers.append(ours(harness, "r"))
    assert answers[0] == answers[1] and len(answers[0][0]) > 0
