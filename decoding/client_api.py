"""The contract between the HTTP layer and the engine.

``server/`` only ever talks to an ``EngineClient``: tokenization, chat templates and generation
all go through it, so the HTTP layer never imports torch and tests can drive it with a fake.
Text work is ``async``: an engine client runs it off the event loop, so a long prompt being
tokenized never stalls ``/health`` or other streams.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from decoding.media import ImageInput
from decoding.outputs import RequestOutput
from decoding.params import GenerationParams, ParameterError
from decoding.params.model_checks import ModelFacts, check_against_model, check_text_size
from decoding.transcripts import TranscriptionJob, TranscriptionUpdate


class QueueFullError(RuntimeError):
    """The waiting queue is at its bound; the caller should retry after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class LoraBusyError(RuntimeError):
    """An adapter cannot be unloaded while requests use it (the HTTP layer answers 409)."""


class LoraLimitError(RuntimeError):
    """Loading one more adapter would pass ``--max-loaded-loras`` and every loaded one has requests in flight
    (none idle to unload): the HTTP layer answers 429; retry once one of them is idle."""


class EngineUnavailableError(RuntimeError):
    """The engine is not accepting requests (still loading, draining for shutdown, or its worker died)."""


@dataclass(frozen=True)
class ServedModel:
    """One entry of ``/v1/models``."""

    name: str
    role: str = "target"  # "target" or "assistant"
    max_model_len: int = 0  # the context length served: prompt plus generated tokens
    architecture: str = ""  # the transformers class, e.g. "LlamaForCausalLM"
    model_type: str = ""  # the config's model_type, e.g. "llama"
    dtype: str = ""  # the weights' float type (float32, bfloat16, float16)
    quantization: str = "none"  # --quantization: none, gguf, int8, int4
    parent: str | None = None  # a LoRA adapter's base model (role "lora"), as vLLM lists it
    root: str | None = None  # where a LoRA adapter was loaded from
    # what the model does, by HF's pipeline task names: "text-generation" (decoder-only),
    # "text2text-generation" (Bart, Marian: the prompt is the encoder's), "automatic-speech-recognition"
    task: str = "text-generation"


class EngineClient(ABC):
    """Async face of the worker that owns the model."""

    @property
    @abstractmethod
    def model_name(self) -> str:
        """The served name of the target model (its short name, or the folder/file name)."""

    @property
    @abstractmethod
    def facts(self) -> ModelFacts:
        """The model's and server's limits every request is checked against."""

    @property
    def max_model_len(self) -> int:
        """Prompt plus generated tokens may not exceed this."""
        return self.facts.max_model_len

    generation_defaults: dict = {}  # the model's generation_config.json knobs (request > these > server)

    @abstractmethod
    def served_models(self) -> list[ServedModel]: ...

    def serves_loras(self) -> bool:
        """Whether the server serves LoRA adapters at all (``--lora-modules`` or runtime loading)."""
        return False

    def lora_names(self) -> list[str]:
        """The LoRA adapters a request may name as its ``model`` (none unless the server serves them)."""
        return []

    async def load_lora_adapter(self, name: str, path: str) -> None:
        """Load a PEFT adapter folder (already checked to be under ``--lora-dir``) under ``name``.

        Raises ``ParameterError`` with why it cannot be served (``param="lora_path"``), or naming a
        name already taken (``param="lora_name"``); ``LoraLimitError`` past ``--max-loaded-loras`` with
        no idle adapter to unload."""
        raise ParameterError("this server serves no LoRA adapters (start it with --enable-lora-loading and "
                             "--lora-dir)", param="lora_name", code="lora_disabled")  # fmt: skip

    async def unload_lora_adapter(self, name: str) -> None:
        """Forget an adapter. Raises ``ParameterError`` code ``model_not_found`` for an unknown name and
        ``LoraBusyError`` while requests use it (they are never switched to other weights)."""
        raise ParameterError(f"The LoRA adapter '{name}' does not exist", param="lora_name", code="model_not_found")

    @abstractmethod
    def is_alive(self) -> bool:
        """The worker is running (False once it died or stopped): ``/health`` answers 503 otherwise."""

    @abstractmethod
    def is_ready(self) -> bool:
        """Model loaded, worker running and admitting requests (False while draining)."""

    def is_draining(self) -> bool:
        """The server is shutting down: a request that arrives now is refused before any work (a 503
        that a load balancer retries on another replica), while the ones admitted before finish."""
        return False

    def stuck(self) -> str | None:
        """Why the worker is alive but blocked (a custom method that does not stop), or None."""
        return None

    @abstractmethod
    async def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    @abstractmethod
    async def apply_chat_template(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        *,
        add_generation_prompt: bool = True,
        add_special_tokens: bool = False,
        template_kwargs: dict | None = None,
        images: Sequence[ImageInput] = (),
    ) -> list[int]:
        """Token ids of the rendered conversation plus the generation prompt (unless
        ``add_generation_prompt`` is false); ``tools`` (OpenAI's function tools) are rendered by the
        template too. ``add_special_tokens``: the tokenizer's own (a BOS) added to the rendered text,
        which a template usually writes itself (vLLM's ``/tokenize`` option).

        ``images``: the conversation's images in the order of its ``{"type": "image"}`` content parts
        (``decoding.media``); the result is then a ``PromptIds`` carrying them, which ``generate`` takes
        as its ``prompt_ids``. A model that reads no images refuses them: ``ParameterError`` naming the
        first image's part.

        Raises ``ParameterError(param="messages")`` when the tokenizer has no chat template.
        """

    @abstractmethod
    async def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str: ...

    async def token_strings(self, token_ids: list[int]) -> list[str]:
        """Each id's vocabulary entry (the tokenizer's ``convert_ids_to_tokens``; here: its text alone)."""
        return [await self.decode([token_id]) for token_id in token_ids]

    def chat_template_source(self) -> str | None:
        """The source of the chat template a conversation with tools renders through, None when unknown
        (``--tool-call-parser auto`` picks the format whose call markers it writes)."""
        return None

    def check_request(
        self, params: GenerationParams, prompts: Sequence[Sequence[int]], prompt_param: str = "prompt"
    ) -> None:
        """Model-dependent validation (vocabulary, layers, context, batch rows, assistants).

        Raises ``ParameterError`` naming the field; called before ``generate``.
        """
        check_against_model(params, self.facts, prompts, prompt_param)

    async def compile_structured_output(self, params: GenerationParams) -> GenerationParams:
        """``params`` with its structured output compiled (``compiled_grammar``), off the event loop.

        Raises ``ParameterError`` naming the field the constraint came from when it does not
        compile; an engine without a grammar compiler refuses every constraint the same way.
        """
        spec = params.structured_output
        if spec is None:
            return params
        raise ParameterError(f"{spec.param} is not supported by this engine", param=spec.param, code="unsupported")

    def check_text_size(self, texts: Sequence[str], param: str) -> None:
        """Before tokenizing: a text that cannot fit the context is a 400 without any tokenizer work."""
        check_text_size(sum(len(text) for text in texts), self.facts, param)

    @abstractmethod
    def generate(
        self, request_id: str, prompt_ids: list[int], params: GenerationParams
    ) -> AsyncIterator[RequestOutput]:
        """Submit a request and iterate over its outputs until one has ``finished=True``.

        Raises ``QueueFullError`` at once when the waiting queue is full, and
        ``EngineUnavailableError`` when draining or when the worker is gone. An output with
        ``error`` set ends the request: ``error_code`` "unavailable" means the server stopped
        (retry elsewhere), "internal" a bug. Closing the iterator early (client disconnect)
        aborts the request in the worker.
        """

    @abstractmethod
    async def abort(self, request_id: str) -> None: ...

    def transcribe(self, request_id: str, job: TranscriptionJob) -> AsyncIterator[TranscriptionUpdate]:
        """Transcribe (or translate) ``job``'s audio: updates as the text is decoded, the last one
        ``done``. Raises ``ParameterError`` naming the field the model or the file cannot serve (``file``
        for audio that cannot be decoded, ``model`` for a model that does not take audio), and the
        errors ``generate`` raises."""
        raise ParameterError(f"model '{self.model_name}' does not transcribe speech", param="model",
                             code="model_not_supported")  # fmt: skip
