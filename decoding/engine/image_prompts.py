"""A chat with images turned into the prompt a vision-language model reads, on the client's text thread.

The files are opened under the server's limits (``vision.image_files``: a bomb or a broken file is a 400
naming its part), put into the conversation's ``{"type": "image"}`` parts, and the model's processor
renders, tokenizes and preprocesses them in one ``apply_chat_template(tokenize=True)`` call, as a
transformers user does; ``vision.prompt`` keeps what the engine needs from its output. GIT, whose image is a
prefix of the model's own rather than placeholders in its text, has its own rule (``vision.git_prompt``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from decoding.media import ImageInput, PromptIds
from decoding.params import GenerationParams, ParameterError
from decoding.vision.git_prompt import git_prompt, is_git, placeholder_id
from decoding.vision.image_files import open_image
from decoding.vision.prompt import build_image_prompt, image_digest, image_token_id, with_images


class ImagePrompter:
    def __init__(self, processor: Any, model: torch.nn.Module, max_pixels: int) -> None:  # noqa: ANN401
        self.processor = processor
        self.config = model.config
        self.git = is_git(model.config)  # its image goes before the text, at the prompt's front
        # a prompt without a chat template is still one: GIT's documented rule, [CLS] + the text
        self.needs_template = not self.git
        self.image_token_id = placeholder_id(model.config) if self.git else image_token_id(model.config)
        inner = getattr(model, "model", model)
        self._rope_index = getattr(inner, "get_rope_index", None)  # Qwen2-VL's M-RoPE positions
        self.max_pixels = max_pixels

    def prompt(
        self,
        messages: list[dict],
        images: Sequence[ImageInput],
        *,
        chat_template: str | None,
        tools: list[dict] | None,
        add_generation_prompt: bool,
        template_kwargs: dict | None,
    ) -> PromptIds:
        """The conversation's token ids with its images (``PromptIds.media``; none for a conversation without
        images, whose ids are still the processor's, as ``generate()`` users get them). Raises ``ParameterError``
        naming the part of a file that cannot be opened, and ``messages`` when the template cannot render."""
        opened = [open_image(image, self.max_pixels) for image in images]
        if self.git:
            ids, record = git_prompt(
                self.processor, self.config, messages, opened, [image_digest(image) for image in opened],
                [image.param for image in images], chat_template=chat_template, tools=tools,
                add_generation_prompt=add_generation_prompt, template_kwargs=template_kwargs,
            )  # fmt: skip
            return PromptIds(ids, record)
        try:
            conversation = with_images(messages, opened)
        except ValueError as error:
            raise ParameterError(f"messages: {error}", param="messages") from error
        options: dict[str, Any] = dict(template_kwargs or {})
        if chat_template is not None:
            options["chat_template"] = chat_template
        if tools:
            options["tools"] = tools
        try:
            processed = self.processor.apply_chat_template(
                conversation, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=True,
                return_tensors="pt", **options,
            )  # fmt: skip
        except Exception as error:
            raise ParameterError(f"the model's processor cannot prepare these messages and images: {error}",
                                 param="messages") from error  # fmt: skip
        if not images:  # a text-only conversation: the processor's ids, nothing for the engine to keep
            return PromptIds(processed["input_ids"][0].tolist())
        digests = [image_digest(image) for image in opened]
        ids, record = build_image_prompt(processed, self.config, digests, [image.param for image in images],
                                         self._rope_index)  # fmt: skip
        return PromptIds(ids, record)

    def check(self, params: GenerationParams, prompts: Sequence[Sequence[int]], param: str) -> None:
        """A prompt holding the image placeholder token must come with its images (a completions prompt
        that spells the token out, or ids copied without their ``media``): a 400, never a silent image. A
        custom ``generate()`` method runs on token ids: it cannot read a prompt's images."""
        for prompt_ids in prompts:
            media = getattr(prompt_ids, "media", None)
            if media is None and self._holds_placeholder(prompt_ids):
                raise ParameterError(f"the {param} holds the model's image placeholder token ({self.image_token_id}) "
                                     "without an image; send images as image parts of a chat message",
                                     param=param, code="invalid_image")  # fmt: skip
            if media is not None and params.custom_generate is not None:
                raise ParameterError("custom_generate runs the model's generate() on token ids; it cannot read a "
                                     "prompt's images", param="custom_generate", code="unsupported")  # fmt: skip

    def _holds_placeholder(self, prompt_ids: Sequence[int]) -> bool:
        """GIT's placeholder is its pad token: an image's only at the prompt's front, where its image goes."""
        if self.git:
            return len(prompt_ids) > 0 and prompt_ids[0] == self.image_token_id
        return self.image_token_id in prompt_ids
