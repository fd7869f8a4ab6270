"""The ``/v1/completions`` body: a prompt (text, token ids, or lists of either), ``echo``, legacy ``logprobs``.

Its translation adds OpenAI's defaults for completions (16 tokens; ``logprobs`` with ``echo`` also
scores the prompt) to the shared one (``server.translate.params``). Fields the engine never sees
(``suffix``, ``best_of`` other than ``n``) are refused here.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Any

from decoding import GenerationParams, ParameterError
from server.translate.fields import GenerationFields
from server.translate.params import to_params

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


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

    def single_prompt(self) -> bool:
        return isinstance(self.prompt, str) or bool(self.prompt and all(isinstance(p, int) for p in self.prompt))

    def sized_lists(self) -> dict[str, Sized | None]:
        return {} if self.single_prompt() else {"prompt": self.prompt}

    def rendered_texts(self) -> dict[str, list[str]]:
        texts = [self.prompt] if isinstance(self.prompt, str) else [p for p in self.prompt if isinstance(p, str)]
        return {"prompt": texts, **super().rendered_texts()}

    def prompts_or_error(self) -> list[str | list[int]]:
        if self.suffix is not None:
            raise ParameterError("suffix is not supported", param="suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise ParameterError("best_of is not supported (use n, or num_beams for beam search)", param="best_of")
        prompts: list = [self.prompt] if self.single_prompt() else list(self.prompt)
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ParameterError("prompt must not be empty", param="prompt")
        return prompts
