"""The ``/v1/chat/completions`` body: messages for the chat template, chat's logprobs, OpenAI's tools.

Its translation is the shared one (``server.translate.params``) with chat's default length, what
the context leaves after the rendered prompt (``with_context_default``, once the template ran), and
its tools as a ``ToolUse``. Every text the template renders (contents, names, tool-call arguments,
the tools' JSON) is declared in ``rendered_texts`` so the one size check covers it.
"""

from __future__ import annotations

import json
from collections.abc import Sized
from typing import Any, Literal

from pydantic import Field

from decoding import GenerationParams, ParameterError
from server.translate.fields import GenerationFields
from server.translate.params import to_params
from server.translate.strict import Strict
from server.translate.tools import Tool, ToolChoice, ToolUse


class TextPart(Strict):
    type: Literal["text"]
    text: str


class CalledFunction(Strict):
    name: str
    arguments: str  # a JSON object, as OpenAI sends it


class MessageToolCall(Strict):
    id: str
    type: Literal["function"]
    function: CalledFunction


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a tool turn: which call it answers

    def as_template_message(self, index: int) -> dict[str, Any]:
        """The message as chat templates take it (arguments as objects, as HF's templates expect)."""
        param = f"messages[{index}]"
        if self.role == "tool" and not self.tool_call_id:
            raise ParameterError(f"{param}: a tool message needs tool_call_id", param="messages")
        if self.tool_calls and self.role != "assistant":
            raise ParameterError(f"{param}: only an assistant message carries tool_calls", param="messages")
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments, param)}}
                for call in self.tool_calls
            ]  # fmt: skip
        return out

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def rendered_texts(self) -> list[str]:
        """Everything of this message the template writes out."""
        calls = [text for call in self.tool_calls or [] for text in (call.function.name, call.function.arguments)]
        return [self.text(), *([self.name] if self.name else []), *calls]


class ChatCompletionRequest(GenerationFields):
    messages: list[ChatMessage] = Field(default_factory=list)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def params(self, model_defaults: dict[str, Any] | None, max_model_len: int = 1 << 30) -> GenerationParams:
        """Validated params; the default length stands for the context's room until the prompt is
        rendered (``server.translate.params.with_context_default``)."""
        return to_params(
            self, default_max_tokens=max_model_len, model_defaults=model_defaults, logprobs=self.logprobs_count()
        )

    def tool_use(self) -> ToolUse | None:
        if self.tools is None and self.tool_choice is None:
            return None
        return ToolUse(list(self.tools or []), self.tool_choice, self.parallel_tool_calls is not False)

    def template_tools(self) -> list[dict[str, Any]] | None:
        tool_use = self.tool_use()
        return tool_use.template_json() if tool_use else None

    def sized_lists(self) -> dict[str, Sized | None]:
        return {"messages": self.messages, "tools": self.tools}  # the template renders the tools with them

    def rendered_texts(self) -> dict[str, list[str]]:
        texts = [text for message in self.messages for text in message.rendered_texts()]
        tools = self.template_tools()
        return {"messages": texts + ([json.dumps(tools)] if tools else []), **super().rendered_texts()}

    def messages_or_error(self) -> list[dict[str, Any]]:
        if not self.messages:
            raise ParameterError("messages must not be empty", param="messages")
        return [m.as_template_message(i) for i, m in enumerate(self.messages)]

    def logprobs_count(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise ParameterError("top_logprobs requires logprobs=true", param="top_logprobs")
        if not self.logprobs:
            return None
        return self.top_logprobs or 0


def _arguments(text: str, param: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        message = f"{param}: tool_calls arguments must be a JSON object: {error}"
        raise ParameterError(message, param="messages") from error
