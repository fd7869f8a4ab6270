"""GIT's prompt (microsoft/git-base and its fine-tunes): its image is no token of the text but a prefix the model
puts before it, laid out here as placeholder positions at the front of the prompt.

``GitModel`` runs its image encoder and projection on ``pixel_values`` and concatenates the features BEFORE the
text's embeddings; the text's learned positions count from 0 at its first token (``generate()`` numbers them from
the attention mask over the text alone), the image's tokens attend each other both ways and every text token
sees all of them. ``generate()``'s ``input_ids`` hold the text only.

The engine keeps the image where the model puts it: the prompt's ids start with one placeholder per image feature
(the pad token; any id would do, the features replace those positions' hidden states), so the image takes its KV
positions, the prefix cache keys them by the image's content hash (``ImagePrompt.cache_keys``: the same image in a
later turn is read from the cache, another image behind the same text never is) and ``/tokenize`` counts them.
``text_start`` tells the runner where the text's positions start (``model.git_forward``) and the sampling state
which ids are ``generate()``'s ``input_ids`` (repetition penalty, n-grams, stop strings read those).

The text:
- with a chat template (the tokenizer's, or ``--chat-template``): the processor's ``apply_chat_template`` renders
  and tokenizes the conversation with it, as for every other family (GIT's processor keeps no template of its own);
- without one (microsoft/git-base has none): the rule GIT's own documentation gives (``GitForCausalLM``'s visual
  question answering example, HF's image-to-text pipeline): ``[CLS]`` + the prompt's tokens without special
  tokens, where the conversation is one user message whose image part is the image and whose text parts are the
  prompt; no text is ``[CLS]`` alone, where ``generate()`` starts a caption.
A prompt holds at most one image: ``GitModel`` places one image's features before the text, it has no place for a
second.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image

from decoding.params import ParameterError
from decoding.vision.prompt import TEXT_INPUTS, ImagePrompt, with_images


def is_git(config: Any) -> bool:
    return getattr(config, "model_type", "") == "git"


def image_positions(config: Any) -> int:
    """How many features GIT's image encoder gives an image: its patches and the class token."""
    vision = config.vision_config
    return (vision.image_size // vision.patch_size) ** 2 + 1


def placeholder_id(config: Any) -> int:
    """The id the prompt holds at each image position (the pad token)."""
    pad = getattr(config, "pad_token_id", None)
    return pad if isinstance(pad, int) else 0


def git_prompt(
    processor: Any,  # noqa: ANN401
    config: Any,  # noqa: ANN401
    messages: list[dict],
    images: Sequence[Image.Image],
    digests: list[str],
    params: list[str],
    *,
    chat_template: str | None,
    tools: list[dict] | None,
    add_generation_prompt: bool,
    template_kwargs: dict | None,
) -> tuple[list[int], ImagePrompt | None]:
    """(the prompt's ids, the record of its image; None without one). ``messages`` hold a ``{"type": "image"}``
    part where the image stands; ``chat_template`` is the one to render with (None: the tokenizer's, if any)."""
    if len(images) > 1:
        raise ParameterError(f"{params[1]}: GIT reads one image per prompt (its model puts one image's features "
                             f"before the text); this conversation holds {len(images)}", param=params[1],
                             code="too_many_images")  # fmt: skip
    template = chat_template or processor.chat_template or getattr(processor.tokenizer, "chat_template", None)
    if template is not None:
        conversation = _placed(messages, images)
        try:
            processed = processor.apply_chat_template(
                conversation, chat_template=template, add_generation_prompt=add_generation_prompt, tokenize=True,
                return_dict=True, return_tensors="pt", tools=tools, **(template_kwargs or {}),
            )  # fmt: skip
        except Exception as error:
            raise ParameterError(f"the model's processor cannot prepare these messages and images: {error}",
                                 param="messages") from error  # fmt: skip
        text_ids = processed["input_ids"][0].tolist()
    else:
        if tools:
            raise ParameterError("this model has no chat template to render tools with", param="tools")
        if template_kwargs:
            raise ParameterError("this model has no chat template to pass these variables to",
                                 param="chat_template_kwargs")  # fmt: skip
        text = _prompt_text(messages)
        processed = processor(text=text or None, images=list(images) or None, add_special_tokens=False,
                              return_tensors="pt")  # fmt: skip
        tokenizer = processor.tokenizer
        start = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
        text_ids = [start] + (processed["input_ids"][0].tolist() if text else [])
    if not images:
        return text_ids, None
    count = image_positions(config)
    pixel_inputs = {name: value for name, value in processed.items() if name not in TEXT_INPUTS and value is not None}
    key = hashlib.sha256(digests[0].encode()).hexdigest()  # as every family keys its first image's tokens
    record = ImagePrompt(list(digests), list(params), pixel_inputs, torch.arange(count, device="cpu"),
                         {position: ("image", key, position) for position in range(count)},
                         bidirectional=((0, count),), text_start=count)  # fmt: skip
    return [placeholder_id(config)] * count + text_ids, record


def _placed(messages: list[dict], images: Sequence[Image.Image]) -> list[dict]:
    """The conversation with the image in its part (the processor reads it from there)."""
    try:
        return with_images(messages, images)
    except ValueError as error:
        raise ParameterError(f"messages: {error}", param="messages") from error


def _prompt_text(messages: list[dict]) -> str:
    """The prompt of a conversation without a chat template: its one user message's text parts, as written."""
    if len(messages) != 1 or messages[0].get("role") != "user":
        roles = ", ".join(str(message.get("role")) for message in messages) or "none"
        raise ParameterError(f"messages: this model has no chat template, so a conversation is one user message (its "
                             f"image and its text, the prompt); this one has messages of roles {roles}",
                             param="messages")  # fmt: skip
    content = messages[0].get("content")
    if isinstance(content, str):
        return content
    texts = []
    for index, part in enumerate(content or []):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            texts.append(part.get("text", ""))
        elif kind != "image":
            raise ParameterError(f"messages[0].content[{index}]: a {kind} part has no place in this model's prompt "
                                 "(its image and text parts only)", param=f"messages[0].content[{index}]")  # fmt: skip
    return "".join(texts)
