"""The two OpenAI generation bodies, ``/v1/completions`` and ``/v1/chat/completions``.

Each adds its own fields to the shared ``GenerationFields`` (the prompt or the messages, how
logprobs are asked for) and its OpenAI defaults for the translation (16 tokens for completions,
what the context has left for chat), then hands over to ``server.translate``. FastAPI derives the
request schemas of ``/openapi.json`` from these classes. Fields the engine never sees (``suffix``,
``best_of``) are refused here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from decoding import GenerationParams, ParameterError
from server.generation_fields import GenerationFields, Strict
from server.translate import to_params

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

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
            prompts = list(prompt)
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ParameterError("prompt must not be empty", param="prompt")
        return prompts


class ChatCompletionRequest(GenerationFields):
    messages: list[ChatMessage] = Field(default_factory=list)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None

    def max_token_fields(self) -> dict[str, int | None]:
        return {**super().max_token_fields(), "max_completion_tokens": self.max_completion_tokens}

    def params(self, model_defaults: dict[str, Any] | None, room: int) -> GenerationParams:
        """Chat's default length is what the context has left after the prompt (``room``, at least 1:
        a prompt that fills the context is then a context-length error naming ``messages``)."""
        return to_params(
            self, default_max_tokens=max(1, room), model_defaults=model_defaults, logprobs=self.logprobs_count()
        )

    def messages_or_error(self) -> list[dict[str, str]]:
        if not self.messages:
            raise ParameterError("messages must not be empty", param="messages")
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]

    def logprobs_count(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise ParameterError("top_logprobs requires logprobs=true", param="top_logprobs")
        if not self.logprobs:
            return None
        return self.top_logprobs or 0
