"""The contract between the HTTP layer and the engine.

``server/`` only ever talks to an ``EngineClient``: tokenization, chat templates and generation
all go through it, so the HTTP layer never imports torch and tests can drive it with a fake.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass

from decoding.outputs import RequestOutput
from decoding.params import GenerationParams


class QueueFullError(RuntimeError):
    """The waiting queue is at its bound; the caller should retry after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EngineUnavailableError(RuntimeError):
    """The engine is not accepting requests (still loading, or draining for shutdown)."""


@dataclass(frozen=True)
class ServedModel:
    """One entry of ``/v1/models``."""

    name: str
    role: str = "target"  # "target" or "assistant"
    max_model_len: int = 0


class EngineClient(ABC):
    """Async face of the worker that owns the model."""

    @property
    @abstractmethod
    def model_name(self) -> str:
        """The served name of the target model (its short name, or the folder/file name)."""

    @property
    @abstractmethod
    def max_model_len(self) -> int:
        """Prompt plus generated tokens may not exceed this."""

    generation_defaults: dict = {}  # the model's generation_config.json knobs (request > these > server)

    @abstractmethod
    def served_models(self) -> list[ServedModel]: ...

    @abstractmethod
    def is_ready(self) -> bool:
        """Model loaded, worker running and admitting requests (False while draining)."""

    @abstractmethod
    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    @abstractmethod
    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of the rendered conversation plus the generation prompt.

        Raises ``ParameterError(param="messages")`` when the tokenizer has no chat template.
        """

    @abstractmethod
    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str: ...

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @abstractmethod
    def check_params(self, params: GenerationParams) -> None:
        """Model-dependent validation (token ids inside the vocabulary, known assistant, ...).

        Raises ``ParameterError`` naming the field; called before ``generate``.
        """

    @abstractmethod
    def generate(
        self, request_id: str, prompt_ids: list[int], params: GenerationParams
    ) -> AsyncIterator[RequestOutput]:
        """Submit a request and iterate over its outputs until one has ``finished=True``.

        Raises ``QueueFullError`` at once when the waiting queue is full, and
        ``EngineUnavailableError`` when draining. Closing the iterator early (client disconnect)
        aborts the request in the worker.
        """

    @abstractmethod
    async def abort(self, request_id: str) -> None: ...
