"""The two OpenAI generation bodies, ``/v1/completions`` and ``/v1/chat/completions``.

Each adds its own fields to the shared ``GenerationFields`` (the prompt or the messages, how
logprobs are asked for) and its OpenAI defaults for the translation (16 tokens for completions,
what the context has left for chat), then hands over to ``server.translate``. FastAPI derives the
request schemas of ``/openapi.json`` from these classes. Fields the engine never sees (``suffix``,
``best_of``) are refused here.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from decoding import GenerationParams, ParameterError
from decoding.params import check_size, validate
from server.generation_fields import GenerationFields, Strict
from server.tools import Tool, ToolChoice, call_grammar, check_tools, offered, template_tools
from server.translate import to_params

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


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


class CompletionRequest(GenerationFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None

    def params(self, model_defaults: dict[str, Any] | None = None) -> GenerationParams:
        """OpenAI's defaults for completions: 16 tokens; ``logprobs`` with ``echo`` also scores the prompt."""
        return to_params(
            self,
            default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS,
            model_defaults=model_defaults,
            logprobs=self.logprobs,
            prompt_logprobs=self.logprobs if self.echo and self.logprobs is not None else None,
        )

    def prompts_or_error(self) -> list[str | list[int]]:
        if self.suffix is not None:
            raise ParameterError("suffix is not supported", param="suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise ParameterError("best_of is not supported (use n, or num_beams for beam search)", param="best_of")
        prompt = self.prompt
        if isinstance(prompt, str):
            prompts: list = [prompt]
        elif prompt and all(isinstance(p, int) for p in prompt):
            prompts = [prompt]
        else:
            check_size("prompt", prompt)
            prompts = list(prompt)
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ParameterError("prompt must not be empty", param="prompt")
        return prompts


class ChatCompletionRequest(GenerationFields):
    messages: list[ChatMessage] = Field(default_factory=list)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def max_token_fields(self) -> dict[str, int | None]:
        return {**super().max_token_fields(), "max_completion_tokens": self.max_completion_tokens}

    def params(self, model_defaults: dict[str, Any] | None, room: int) -> GenerationParams:
        """Chat's default length is what the context has left after the prompt (``room``, at least 1:
        a prompt that fills the context is then a context-length error naming ``messages``)."""
        params = to_params(
            self, default_max_tokens=max(1, room), model_defaults=model_defaults, logprobs=self.logprobs_count()
        )
        return self._with_tools(params)

    def _with_tools(self, params: GenerationParams) -> GenerationParams:
        """"required" or a named function constrains the reply to calls; offered tools keep their tags."""
        check_tools(self.tools, self.tool_choice)
        tools = self.offered_tools()
        if not tools:
            return params
        grammar = call_grammar(tools, self.tool_choice, self.parallel_tool_calls is not False)
        if grammar is not None and params.structured_output is not None:
            raise ParameterError(
                f"tool_choice {self.tool_choice if isinstance(self.tool_choice, str) else 'naming a function'} "
                f"constrains the reply to tool calls; it cannot be combined with {params.structured_output.param}",
                param="tool_choice",
            )
        # a model whose <tool_call> tags are special tokens must still show them to the parser
        params = params.replace(skip_special_tokens=False, **({"structured_output": grammar} if grammar else {}))
        validate(params)
        return params

    def offered_tools(self) -> list[Tool]:
        """The tools the model sees and whose calls are parsed (none with tool_choice "none")."""
        return offered(self.tools, self.tool_choice)

    def template_tools(self) -> list[dict[str, Any]] | None:
        return template_tools(self.offered_tools())

    def messages_or_error(self) -> list[dict[str, Any]]:
        if not self.messages:
            raise ParameterError("messages must not be empty", param="messages")
        check_size("messages", self.messages)
        check_size("tools", self.tools)  # the template renders them with the messages
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
