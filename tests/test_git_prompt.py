"""GIT without a chat template (microsoft/git-base ships none): the prompt follows GIT's documented rule.

``GitForCausalLM``'s own example (visual question answering) and HF's image-to-text pipeline build a prompt as
``[CLS]`` + the question's tokens without special tokens, and caption from ``[CLS]`` alone (``generate()`` with
pixel values only starts from bos). A chat reaches that rule as one user message: its image part is the image, its
text parts the question; any other conversation (a system or assistant turn, several messages), tools or template
variables have no place in it and are a 400 naming what is wrong. The tiny GIT of ``tests/vlm_families.py`` is
saved without its chat template; the engine's tokens are compared with ``generate()`` called the documented way.
"""

from __future__ import annotations

import pytest
import torch

from decoding.media import ImageInput
from decoding.params import GenerationParams, ParameterError
from decoding.params.model_checks import ModelFacts, check_against_model
from tests import vlm_families as vf
from tests.test_engine_vision import MAX_NEW, Served, ours, params_for, png

IMAGE_POSITIONS = 17  # 4x4 patches of 8 px on a 32 px image, and the class token


def bare_git(folder) -> str:  # noqa: ANN001
    """The tiny GIT saved as microsoft/git-base is: no chat template."""
    saved = vf.BY_NAME["git"].save(folder)
    (saved / "chat_template.jinja").unlink()
    return str(saved)


def documented(folder: str, text: str, seed: int, max_new_tokens: int = MAX_NEW) -> tuple[list[int], list[int]]:
    """(the prompt's ids, ``generate()``'s greedy tokens cut after eos) the way GIT's documentation calls it."""
    processor, model = vf.load(folder)
    pixel_values = processor(images=vf.make_image(seed), return_tensors="pt").pixel_values
    kwargs = dict(pixel_values=pixel_values, max_new_tokens=max_new_tokens, do_sample=False)
    ids = [processor.tokenizer.convert_tokens_to_ids("[CLS]")]  # BERT's cls token (the tiny tokenizer's bos)
    if text:
        ids += processor(text=text, add_special_tokens=False).input_ids
        kwargs["input_ids"] = torch.tensor([ids])
    with torch.inference_mode():
        out = model.generate(**kwargs)[0, len(ids) :].tolist()  # no input_ids: generate() starts from [CLS]
    eos = model.generation_config.eos_token_id
    return ids, out[: out.index(eos) + 1] if eos in out else out


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> Served:
    served = Served(vf.BY_NAME["git"], bare_git(tmp_path_factory.mktemp("git-bare")))
    assert served.processor.tokenizer.chat_template is None and served.processor.chat_template is None
    return served


def ask(served: Served, messages: list[dict], seeds: list[int], **options: object):  # noqa: ANN201
    images = [ImageInput(png(vf.make_image(seed)), f"messages[0].content[{i}]") for i, seed in enumerate(seeds)]
    kwargs = {**dict(chat_template=None, tools=None, add_generation_prompt=True, template_kwargs=None), **options}
    return served.prompter.prompt(messages, images, **kwargs)


@pytest.mark.parametrize("text", ["what is on the picture?", ""])
def test_a_question_or_a_caption_equals_generate_called_as_documented(bare, text):
    parts = [{"type": "image"}, *([{"type": "text", "text": text}] if text else [])]
    prompt = ask(bare, [{"role": "user", "content": parts}], [1])
    ids, expected = documented(bare.folder, text, 1)
    assert prompt.media.text_start == IMAGE_POSITIONS and list(prompt)[IMAGE_POSITIONS:] == ids
    harness = bare.harness()
    harness.add("r", list(prompt), params_for("greedy", 0), image_prompt=prompt.media)
    harness.run()
    assert ours(harness, "r") == [expected]


def test_text_parts_are_the_prompt_as_written(bare):
    content = [{"type": "text", "text": "what "}, {"type": "image"}, {"type": "text", "text": "is it?"}]
    prompt = ask(bare, [{"role": "user", "content": content}], [2])
    assert list(prompt)[IMAGE_POSITIONS:] == documented(bare.folder, "what is it?", 2, max_new_tokens=1)[0]
    words = ask(bare, [{"role": "user", "content": "just words"}], [])  # no image: the text alone, [CLS] first
    assert words.media is None and list(words) == [bare.processor.tokenizer.convert_tokens_to_ids("[CLS]")] + (
        bare.processor(text="just words", add_special_tokens=False).input_ids
    )


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "image"}]}],
        [
            {"role": "user", "content": [{"type": "image"}]},
            {"role": "assistant", "content": "a cat"},
            {"role": "user", "content": "and?"},
        ],  # fmt: skip
        [{"role": "user", "content": [{"type": "image"}]}, {"role": "user", "content": "what?"}],
    ],
    ids=["system", "assistant", "two-users"],
)
def test_other_conversations_are_a_400_naming_messages(bare, messages):
    with pytest.raises(ParameterError) as error:
        ask(bare, messages, [3])
    assert error.value.param == "messages" and "one user message" in str(error.value)


def test_tools_and_template_variables_are_a_400_naming_them(bare):
    one = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]}]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(ParameterError) as error:
        ask(bare, one, [3], tools=[tool])
    assert error.value.param == "tools"
    with pytest.raises(ParameterError) as error:
        ask(bare, one, [3], template_kwargs={"style": "short"})
    assert error.value.param == "chat_template_kwargs"


def test_max_length_counts_the_text_as_generate_does(bare):
    """``max_length`` counts ``generate()``'s ``input_ids``, which hold no image positions: a limit between the text's
    length and the whole prompt's is served, with the tokens ``generate()`` gives."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]}]
    prompt = ask(bare, messages, [4])
    ids = list(prompt)[IMAGE_POSITIONS:]
    params = GenerationParams(max_length=len(ids) + 3, do_sample=False)
    check_against_model(params, ModelFacts(vocab_size=len(bare.processor.tokenizer), max_model_len=256), [prompt],
                        "messages")  # fmt: skip
    harness = bare.harness()
    harness.add("r", list(prompt), params, image_prompt=prompt.media)
    harness.run()
    pixel_values = bare.processor(images=vf.make_image(4), return_tensors="pt").pixel_values
    with torch.inference_mode():
        out = bare.model.generate(input_ids=torch.tensor([ids]), pixel_values=pixel_values, max_length=len(ids) + 3,
                                  do_sample=False)  # fmt: skip
    assert ours(harness, "r") == [out[0, len(ids) :].tolist()] and len(ours(harness, "r")[0]) == 3
