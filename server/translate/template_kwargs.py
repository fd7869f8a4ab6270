"""``chat_template_kwargs`` (vLLM's field): variables a request hands the chat template, such as Qwen3's
``enable_thinking``.

Names the template step sets itself (the conversation, the tools, the generation prompt, the template
and how it is tokenized) are refused: passed through, they would replace what the server renders, or
break the call into transformers. Every other name must be an identifier, since a template reads it
as a variable; the values are JSON, kept small by the body's size limit.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator

from decoding import ParameterError

RESERVED = frozenset({
    "messages", "conversation", "tools", "documents", "add_generation_prompt", "continue_final_message",
    "chat_template", "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs",
})  # fmt: skip


def _checked(value: Any) -> Any:  # noqa: ANN401
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ParameterError("chat_template_kwargs must be an object of template variables",
                             param="chat_template_kwargs")  # fmt: skip
    for name in value:
        if name in RESERVED:
            raise ParameterError(f"chat_template_kwargs.{name} is set by the server's template step",
                                 param=f"chat_template_kwargs.{name}")  # fmt: skip
        if not name.isidentifier():
            raise ParameterError(f"chat_template_kwargs: {name!r} is not a template variable name",
                                 param="chat_template_kwargs")  # fmt: skip
    return value


TemplateKwargs = Annotated[dict[str, Any], BeforeValidator(_checked)]


def thinking_allowed(template_kwargs: dict[str, Any] | None) -> bool:
    """False when the request turned the model's thinking off (``enable_thinking: false``, Qwen3's and
    the reasoning templates' spelling): its whole reply is then the answer."""
    return not (template_kwargs and template_kwargs.get("enable_thinking") is False)
