"""The bodies of ``POST /tokenize`` (a prompt, or chat messages through the chat template) and
``POST /detokenize`` (token ids), as vLLM's ``TokenizeRequest`` and ``DetokenizeRequest`` have them."""

from __future__ import annotations

from typing import Any

from decoding import ParameterError
from server.api.chat.messages import ChatMessage
from server.translate.images import ImagePart
from server.translate.strict import Strict
from server.translate.template_kwargs import TemplateKwargs
from server.translate.tools import Tool


class TokenizeRequest(Strict):
    """Exactly one of ``prompt`` (tokenized as is; ``add_special_tokens`` defaults to true) and
    ``messages`` (rendered by the chat template as ``/v1/chat/completions`` renders them, so its
    ``count`` is that endpoint's ``prompt_tokens``; ``add_special_tokens`` defaults to false, since
    a template writes its own BOS)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool | None = None
    tools: list[Tool] | None = None
    chat_template_kwargs: TemplateKwargs | None = None
    return_token_strs: bool = False

    def checked(self) -> TokenizeRequest:
        """What the schema cannot say: one input, and the chat-only fields only with messages."""
        if (self.prompt is None) == (self.messages is None):
            raise ParameterError("give exactly one of prompt and messages", param="prompt",
                                 code="missing_field" if self.prompt is None else "invalid_parameter")  # fmt: skip
        if self.messages is not None and not self.messages:
            raise ParameterError("messages must not be empty", param="messages")
        if self.prompt is not None:
            for name in ("tools", "add_generation_prompt", "chat_template_kwargs"):
                if name in self.model_fields_set:
                    raise ParameterError(f"{name} applies to messages (the chat template), not to a prompt",
                                         param=name)  # fmt: skip
        return self

    def template_messages(self) -> list[dict[str, Any]]:
        return [message.as_template_message(i) for i, message in enumerate(self.messages or [])]

    def image_parts(self) -> list[ImagePart]:
        """The conversation's images, in the order the template meets them (counted in ``count``)."""
        return [part for i, m in enumerate(self.messages or []) for part in m.image_parts(f"messages[{i}]")]

    def template_tools(self) -> list[dict[str, Any]] | None:
        return [tool.model_dump(exclude_none=True) for tool in self.tools] if self.tools else None

    def texts(self) -> list[str]:
        """Every text the tokenizer or the template will read (checked against the context first)."""
        if self.prompt is not None:
            return [self.prompt]
        return [text for message in self.messages or [] for text in message.rendered_texts()]


class TokenizeResponse(Strict):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(Strict):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(Strict):
    prompt: str
