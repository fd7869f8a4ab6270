"""The ``/v1/chat/completions`` body: messages for the chat template, chat's logprobs, OpenAI's tools.

Every field OpenAI defines for chat is known (a body from any client parses, or is a 400 naming the
field): honoured (``prediction``, OpenAI's Predicted Outputs: the draft prompt lookup decoding
searches first), accepted as the hint OpenAI documents it to be (``RequestHints``, and here
``reasoning_effort``, ``verbosity``; each comment says why it has nothing to do here), or refused
because a text-only model cannot do it (``audio``, ``modalities`` with audio,
``web_search_options``, ``moderation``) or a custom (free-form) tool. ``tool_choice``
``allowed_tools`` offers only the tools it names. The legacy ``functions`` / ``function_call`` are
read as ``tools`` / ``tool_choice``. The messages themselves are ``server.api.chat.messages``.

Its translation is the shared one (``server.translate.params``) with chat's default length, what
the context leaves after the rendered prompt (``with_context_default``, once the template ran), and
its tools as a ``ToolUse``. Every text the template renders (contents, names, tool-call arguments,
the tools' JSON) is declared in ``rendered_texts`` so the one size check covers it.
"""

from __future__ import annotations

import json
from collections.abc import Sized
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from decoding import GenerationParams, ParameterError
from server.api.chat.messages import TEXT_ONLY, ChatMessage, TextPart
from server.translate.fields import GenerationFields, RequestHints
from server.translate.images import ImagePart
from server.translate.params import to_params
from server.translate.strict import Strict
from server.translate.template_kwargs import TemplateKwargs
from server.translate.tools import (
    AllowedToolsChoice,
    ChatTool,
    ChatToolChoice,
    FunctionDefinition,
    FunctionName,
    NamedToolChoice,
    Tool,
    ToolChoice,
    ToolUse,
    allowed_subset,
)


def _refused(what: str, reason: str) -> Any:  # noqa: ANN401
    """A field this server cannot honour: null, or a 400 naming it that says why (its schema: null)."""

    def refuse(value: Any) -> None:  # noqa: ANN401
        if value is not None:
            raise ParameterError(f"this server does not support {what}: {reason}")

    return Annotated[None, BeforeValidator(refuse)]


def _text_modality(value: Any) -> Any:  # noqa: ANN401
    if isinstance(value, list) and "audio" in value:
        raise ParameterError(f'{TEXT_ONLY}: modalities may only be ["text"], got {json.dumps(value)}')
    return value


NoAudioOutput = _refused("audio output", "it serves a text-only model")
NoWebSearch = _refused("web search", "offer a search function in tools and run it yourself")
NoModeration = _refused("moderation", "it runs no moderation model")


class PredictionContent(Strict):
    """OpenAI's Predicted Outputs: text the reply is expected to mostly repeat."""

    type: Literal["content"]
    content: str | list[TextPart]


class ChatCompletionRequest(GenerationFields, RequestHints):
    messages: list[ChatMessage] = Field(default_factory=list)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[ChatTool] | None = None  # function tools (custom tools are refused: not served)
    tool_choice: ChatToolChoice | None = None  # allowed_tools offers only the tools it names
    parallel_tool_calls: bool | None = None
    # legacy function calling (OpenAI's before tools): tools of type function and their tool_choice
    functions: list[FunctionDefinition] | None = None
    function_call: Literal["none", "auto"] | FunctionName | None = None
    # hints, accepted as OpenAI documents them and changing nothing here:
    # - reasoning_effort: for reasoning models; the served model has no separate reasoning phase to bound
    # - verbosity: a model trained to follow it is not served here; max_tokens bounds a reply's length
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    prediction: PredictionContent | None = None  # honoured: prompt lookup drafts from it (server.translate.params)
    # vLLM's: variables the chat template reads (Qwen3's enable_thinking, ...); names the template step
    # itself sets are refused (server.translate.template_kwargs)
    chat_template_kwargs: TemplateKwargs | None = None
    modalities: Annotated[list[Literal["text"]], BeforeValidator(_text_modality)] | None = None
    # refused unless null
    audio: NoAudioOutput = None
    web_search_options: NoWebSearch = None
    moderation: NoModeration = None

    @model_validator(mode="after")
    def _tools_or_legacy_functions(self) -> ChatCompletionRequest:
        """One spelling of tool use per body: mixed, one half would go unread."""
        legacy = [name for name in ("functions", "function_call") if getattr(self, name) is not None]
        current = [name for name in ("tools", "tool_choice", "parallel_tool_calls") if getattr(self, name) is not None]
        if legacy and current:
            message = (f"give tools, tool_choice and parallel_tool_calls or the legacy functions and function_call, "
                       f"not both: got {legacy[0]} with {current[0]}")  # fmt: skip
            raise ParameterError(message, param=legacy[0])
        return self

    def params(self, model_defaults: dict[str, Any] | None, max_model_len: int = 1 << 30) -> GenerationParams:
        """Validated params; the default length stands for the context's room until the prompt is
        rendered (``server.translate.params.with_context_default``)."""
        return to_params(
            self, default_max_tokens=max_model_len, model_defaults=model_defaults, logprobs=self.logprobs_count()
        )

    def tool_use(self) -> ToolUse | None:
        if self.functions is not None or self.function_call is not None:
            return _legacy_tool_use(self.functions or [], self.function_call)
        if self.tools is None and self.tool_choice is None:
            return None
        tools, choice = list(self.tools or []), self.tool_choice
        if isinstance(choice, AllowedToolsChoice):
            names = [named.function.name for named in choice.allowed_tools.tools]
            tools, choice = allowed_subset(tools, names), choice.allowed_tools.mode
        return ToolUse(tools, choice, self.parallel_tool_calls is not False)

    def template_tools(self) -> list[dict[str, Any]] | None:
        tool_use = self.tool_use()
        return tool_use.template_json() if tool_use else None

    def sized_lists(self) -> dict[str, Sized | None]:
        tools = self.tools if self.functions is None else self.functions  # the template renders them with the messages
        return {"messages": self.messages, "tools": tools}

    def rendered_texts(self) -> dict[str, list[str]]:
        texts = [text for message in self.messages for text in message.rendered_texts()]
        tools = self.template_tools()
        predicted = self.prediction_text()
        return {"messages": texts + ([json.dumps(tools)] if tools else []), **super().rendered_texts(),
                **({"prediction": [predicted]} if predicted is not None else {})}  # fmt: skip

    def prediction_text(self) -> str | None:
        if self.prediction is None:
            return None
        content = self.prediction.content
        return content if isinstance(content, str) else "".join(part.text for part in content)

    def messages_or_error(self) -> list[dict[str, Any]]:
        if not self.messages:
            raise ParameterError("messages must not be empty", param="messages")
        return [m.as_template_message(i) for i, m in enumerate(self.messages)]

    def image_parts(self) -> list[ImagePart]:
        """The conversation's images, in the order the template meets them."""
        return [part for i, m in enumerate(self.messages) for part in m.image_parts(f"messages[{i}]")]

    def logprobs_count(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise ParameterError("top_logprobs requires logprobs=true", param="top_logprobs")
        if not self.logprobs:
            return None
        return self.top_logprobs or 0


def _legacy_tool_use(functions: list[FunctionDefinition], function_call: str | FunctionName | None) -> ToolUse:
    """OpenAI's function calling before tools: each function a tool of type function, ``function_call``
    the tool_choice, and one call per reply, as that API returned (errors name the legacy fields)."""
    names = [function.name for function in functions]
    if len(set(names)) != len(names):
        raise ParameterError(f"functions: names must be unique, got {names}", param="functions")
    if function_call not in (None, "none") and not names:
        raise ParameterError("function_call needs functions", param="function_call")
    choice: ToolChoice | None
    if isinstance(function_call, FunctionName):
        if function_call.name not in names:
            raise ParameterError(f"function_call names function '{function_call.name}', which is not among the "
                                 f"functions {names}", param="function_call")  # fmt: skip
        choice = NamedToolChoice(type="function", function=function_call)
    else:
        choice = function_call
    return ToolUse([Tool(type="function", function=function) for function in functions], choice, False)
