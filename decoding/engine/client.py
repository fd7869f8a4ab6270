"""The only bridge between the asyncio event loop and the worker thread.

``generate`` checks admission synchronously (so a full queue is a 429 before any byte is sent),
then returns an async iterator fed by ``loop.call_soon_threadsafe`` from the worker. Closing the
iterator before the request finished (a client disconnect) aborts it in the worker.

Tokenization, chat templates and ``decode`` run on one thread of the client's own: a 30k-character
prompt then never stalls the event loop, and a fast tokenizer, which must not be used by two
threads at once, is only ever used by that one (the worker detokenizes with its own copy).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from decoding.client_api import EngineClient, EngineUnavailableError, QueueFullError, ServedModel
from decoding.engine.image_prompts import ImagePrompter
from decoding.engine.lora_catalog import LoadsLoras, LoraCatalog
from decoding.engine.transcription import Transcriber
from decoding.engine.worker import Worker
from decoding.media import ImageInput, media_of
from decoding.model.seq2seq import EncoderInput
from decoding.outputs import RequestOutput
from decoding.params import GenerationParams, ParameterError, Strategy
from decoding.params.model_checks import ModelFacts, check_takes_text
from decoding.structured.compiler import CompiledGrammar, GrammarCompiler
from decoding.telemetry import EngineObserver
from decoding.text.template_mends import mend_chat_template
from decoding.transcripts import TranscriptionJob, TranscriptionUpdate

T = TypeVar("T")
logger = logging.getLogger(__name__)
COMPILE_TIMEOUT_S = 10.0  # llguidance's fuel limits bound a compile well below this; the wait is the backstop
MODEL_TEMPLATE = "model"  # the tokenizer's own chat template


@dataclass(frozen=True)
class ChatTemplates:
    """Which chat template renders a conversation: ``--chat-template`` for everything when given;
    else the model's own, except that a conversation with tools whose model template ignores
    ``tools`` (the embedded SmolLM2's) is rendered by the shipped tool-capable one."""

    default: str | None  # MODEL_TEMPLATE, a template's text, or None: the model has none
    with_tools: str | None = None  # the template for a conversation with tools, when it differs

    def choose(self, has_tools: bool) -> str | None:
        return self.with_tools if has_tools and self.with_tools is not None else self.default

    @classmethod
    def for_model(cls, model_template: str | None, override: str | None, tool_template: str | None) -> ChatTemplates:
        if override is not None:
            return cls(override)
        if model_template is None:
            return cls(None)
        mended, reasons = mend_chat_template(model_template)
        for why in reasons:
            logger.info("chat template: mended the model's own (%s)", why)
        renders_tools = "tools" in model_template
        return cls(mended if reasons else MODEL_TEMPLATE, None if renders_tools else tool_template)


def _log_tokenizer_failure(built: Future) -> None:
    """The start-up build's failure, said once in the log; each constrained request then answers it (a 500)."""
    if not built.cancelled() and built.exception() is not None:
        logger.error("structured outputs will fail: %s", built.exception())


class OwnThread(ThreadPoolExecutor):
    """One named thread of the client's (tokenizer, grammar compiler). Once the drain has shut it
    down, work handed to it is an ``EngineUnavailableError`` (a 503 with ``Retry-After`` that a load
    balancer retries elsewhere) instead of the executor's ``RuntimeError`` (a 500): a request that
    got past the drain check just before the drain ended reaches it that late."""

    def __init__(self, thread_name_prefix: str) -> None:
        super().__init__(max_workers=1, thread_name_prefix=thread_name_prefix)

    def submit(self, fn: Callable[..., T], /, *args: object, **kwargs: object) -> Future[T]:
        try:
            return super().submit(fn, *args, **kwargs)
        except RuntimeError as error:  # "cannot schedule new futures after shutdown"
            raise EngineUnavailableError("the server is shutting down") from error


class WorkerEngineClient(LoadsLoras, EngineClient):
    def __init__(
        self,
        worker: Worker,
        tokenizer: object,
        served_name: str,
        facts: ModelFacts,
        max_queue: int,
        has_chat_template: bool,
        assistants: list[ServedModel] | None = None,
        generation_defaults: dict | None = None,
        default_assistant: str | None = None,
        compiler: GrammarCompiler | None = None,
        observer: EngineObserver | None = None,
        templates: ChatTemplates | None = None,
        served_model: ServedModel | None = None,
        max_loaded_loras: int = 8,
    ) -> None:
        """``served_model``: the target's ``/v1/models`` entry (architecture, dtype, quantization). The LoRA
        adapters the engine loaded at start are listed from it (``worker.engine.loras``); at most
        ``max_loaded_loras`` more are loaded at runtime (``lora_catalog``)."""
        self.worker = worker
        self.tokenizer = tokenizer
        self._served_name = served_name
        self._facts = facts
        self._max_queue = max_queue
        self._templates = templates or ChatTemplates(MODEL_TEMPLATE if has_chat_template else None)
        self._assistants = assistants or []
        self._served_model = served_model or ServedModel(served_name, "target", facts.max_model_len)
        self._default_assistant = default_assistant
        # the model's generation_config.json values; requests override them, they override server defaults
        self.generation_defaults = dict(generation_defaults or {})
        self._draining = False
        # requests handed out and not yet ended, counted here rather than in the worker: between
        # taking a submit from its inbox and adding it to the engine, the worker holds it in neither
        self._in_flight: set[str] = set()
        self._lock = threading.Lock()
        self._text_thread = OwnThread(thread_name_prefix="decoda-tokenizer")
        # structured outputs compile on a thread of their own: a slow grammar never delays tokenizing
        self._compiler = compiler
        self._compile_thread = OwnThread(thread_name_prefix="decoda-grammar")
        self.transcriber: Transcriber | None = None  # a Whisper model's (launch.start_engine_client sets it)
        self.image_prompter: ImagePrompter | None = None  # a vision-language model's (likewise)
        if compiler is not None:  # llguidance's view of the vocabulary, built now rather than at the first
            # constraint: for a 150k-token vocabulary (Qwen 2.5) it takes seconds on a busy CPU
            self._compile_thread.submit(compiler.tokenizer).add_done_callback(_log_tokenizer_failure)
        self._observer = observer or EngineObserver()
        loras = getattr(worker.engine, "loras", None)
        pinned = {name: self._lora_entry(name, loras.path_of(name)) for name in (loras.names if loras else [])}
        self._loras = LoraCatalog(pinned, max_loaded_loras)

    # ---- model facts -------------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self._served_name

    @property
    def facts(self) -> ModelFacts:
        return self._facts

    def served_models(self) -> list[ServedModel]:
        return [self._served_model, *self._assistants, *self._loras.entries()]

    # ---- LoRA adapters -----------------------------------------------------------------------------------
    def serves_loras(self) -> bool:
        return getattr(self.worker.engine, "loras", None) is not None

    def lora_names(self) -> list[str]:
        return self._loras.names()

    def _lora_entry(self, name: str, path: str) -> ServedModel:
        target = self._served_model
        return ServedModel(name, "lora", target.max_model_len, target.architecture, target.model_type, target.dtype,
                           target.quantization, parent=target.name, root=path)  # fmt: skip

    def _ended(self, request_id: str) -> None:
        self._in_flight.discard(request_id)
        self._loras.end(request_id)

    def is_alive(self) -> bool:
        return self.worker.alive

    def is_ready(self) -> bool:
        return self.worker.alive and not self._draining

    def is_draining(self) -> bool:
        return self._draining

    def stuck(self) -> str | None:
        custom = getattr(self.worker.engine, "custom", None)
        return custom.watchdog.stuck if custom is not None else None

    # ---- text, on the tokenizer thread ----------------------------------------------------------------
    async def _off_loop(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._text_thread, work)

    async def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return await self._off_loop(lambda: list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens)))

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
        check_takes_text(self._facts)  # a speech model: the audio API, said before any template work
        if images and self.image_prompter is None:
            raise ParameterError(f"model '{self._served_name}' does not take images (it reads text only)",
                                 param=images[0].param, code="model_not_supported")  # fmt: skip
        template = self._templates.choose(bool(tools))
        if template is None and (self.image_prompter is None or self.image_prompter.needs_template):
            raise ParameterError(
                f"model '{self._served_name}' has no chat template (it is a base model); "
                "use /v1/completions with a plain prompt instead, or start the server with --chat-template FILE",
                param="messages",
                code="chat_template_missing",
            )
        options = {} if template is MODEL_TEMPLATE else {"chat_template": template}
        if tools:
            options["tools"] = tools
        if self.image_prompter is not None:  # a vision-language model's processor renders, tokenizes (its own rule
            # for special tokens) and lays out any images, through the model's template (the shipped tool template,
            # for a model whose own ignores tools, knows no images)
            prompter, own = self.image_prompter, self._templates.default
            return await self._off_loop(lambda: prompter.prompt(
                messages, images, chat_template=None if own is MODEL_TEMPLATE else own, tools=tools,
                add_generation_prompt=add_generation_prompt, template_kwargs=template_kwargs))  # fmt: skip
        options |= template_kwargs or {}  # the template's own variables (chat_template_kwargs), checked by the body

        def render() -> list[int]:
            if add_special_tokens:
                text = self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=add_generation_prompt, tokenize=False, **options
                )
                return list(self.tokenizer.encode(text, add_special_tokens=True))
            ids = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt, tokenize=True, **options
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return list(ids)

        try:
            return await self._off_loop(render)
        except EngineUnavailableError:  # the drain stopped the tokenizer thread: a 503, not the messages' fault
            raise
        except Exception as error:  # a template's own raise_exception(), or one that cannot render these messages
            raise ParameterError(f"the chat template cannot render these messages: {error}",
                                 param="messages") from error  # fmt: skip

    async def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return await self._off_loop(lambda: self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens))

    async def token_strings(self, token_ids: list[int]) -> list[str]:
        return await self._off_loop(lambda: list(self.tokenizer.convert_ids_to_tokens(token_ids)))

    def chat_template_source(self) -> str | None:
        template = self._templates.choose(has_tools=True)
        if template != MODEL_TEMPLATE:
            return template
        source = getattr(self.tokenizer, "chat_template", None)
        if isinstance(source, dict):  # a tokenizer with named templates: the tool one when it has one
            source = source.get("tool_use") or source.get("default")
        return source if isinstance(source, str) else None

    # ---- structured outputs, on the compile thread --------------------------------------------------------
    def check_request(self, params: GenerationParams, prompts: Sequence[Sequence[int]],
                      prompt_param: str = "prompt") -> None:  # fmt: skip
        super().check_request(params, prompts, prompt_param)
        if self.image_prompter is not None:
            self.image_prompter.check(params, prompts, prompt_param)

    async def compile_structured_output(self, params: GenerationParams) -> GenerationParams:
        spec = params.structured_output
        if spec is None or self._compiler is None:
            return await super().compile_structured_output(params)
        loop = asyncio.get_running_loop()
        begun = loop.create_future()  # the time limit counts the compile, not the wait behind others'

        def compile_now() -> tuple[CompiledGrammar, bool]:
            self._compiler.tokenizer()  # built once, at start: the limit is this constraint's, not the server's
            loop.call_soon_threadsafe(lambda: begun.done() or begun.set_result(None))
            return self._compiler.compile(spec)

        work = loop.run_in_executor(self._compile_thread, compile_now)
        try:
            await asyncio.wait({begun, work}, return_when=asyncio.FIRST_COMPLETED)
            compiled, cached = await asyncio.wait_for(work, COMPILE_TIMEOUT_S)
        except TimeoutError as error:
            raise ParameterError(f"{spec.param}: compiling the constraint took more than {COMPILE_TIMEOUT_S:g} s; "
                                 "simplify it", param=spec.param, code="invalid_schema") from error  # fmt: skip
        self._observer.on_grammar_compiled(cached, compiled.seconds)
        return params.replace(compiled_grammar=compiled)

    # ---- generation ----------------------------------------------------------------------------------
    def generate(self, request_id: str, prompt_ids: list[int], params: GenerationParams,
                 encoder_input: EncoderInput | None = None) -> AsyncIterator[RequestOutput]:  # fmt: skip
        """``encoder_input``: an encoder-decoder model's encoder input, ``prompt_ids`` then its decoder's
        prompt (the transcription's windows: ``engine/transcription.py``)."""
        if self._default_assistant is not None and params.strategy in (Strategy.GREEDY, Strategy.SAMPLE):
            params = params.replace(assistant_model=self._default_assistant)  # --default-assistant
        with self._lock:
            if self._draining or not self.worker.alive:
                raise EngineUnavailableError(
                    "the server is shutting down" if self._draining else "the engine worker is not running"
                )
            if self.worker.num_pending >= self._max_queue:
                raise QueueFullError(f"the waiting queue is full ({self._max_queue} requests); retry later")
            if params.lora_name is not None:  # unloaded since the route looked: a 404
                self._loras.begin(request_id, params.lora_name)
            loop = asyncio.get_running_loop()
            outputs: asyncio.Queue[RequestOutput] = asyncio.Queue()

            def sink(output: RequestOutput) -> None:
                try:
                    loop.call_soon_threadsafe(outputs.put_nowait, output)
                except RuntimeError:  # the event loop is closed: nobody is left to read it
                    pass

            self._in_flight.add(request_id)
            self.worker.submit(request_id, list(prompt_ids), params, sink, encoder_input, media_of(prompt_ids))
        return OutputStream(request_id, outputs, self.worker.abort, on_end=self._ended)

    async def abort(self, request_id: str) -> None:
        self.worker.abort(request_id)

    def transcribe(self, request_id: str, job: TranscriptionJob) -> AsyncIterator[TranscriptionUpdate]:
        if self.transcriber is None:
            return super().transcribe(request_id, job)
        return self.transcriber.run(request_id, job)

    async def shutdown(self, drain_timeout: float = 30.0) -> None:
        """Stop admitting, let in-flight requests finish up to ``drain_timeout``, then stop.

        Requests still running at the deadline end with an "unavailable" error (HTTP 503).
        """
        with self._lock:
            self._draining = True
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + drain_timeout
        logger.info("draining: %d requests in flight, up to %.0f s", len(self._in_flight), drain_timeout)
        while self.worker.alive and self._in_flight and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if self._in_flight:
            logger.warning("drain deadline passed: %d requests end with a 503", len(self._in_flight))
        else:
            logger.info("drained in %.1f s", loop.time() - started)
        await asyncio.to_thread(self.worker.stop, 10.0)
        # only now, with no request left in the engine: a handler that got in before the drain and is
        # still tokenizing gets its ids (queued work still runs, then generate answers 503); one that
        # submits after this gets EngineUnavailableError (OwnThread), a 503 too, never a 500
        self._text_thread.shutdown(wait=False)
        self._compile_thread.shutdown(wait=False)


class OutputStream:
    """One request's outputs, in order; closing it (or cancelling a read) before the last one aborts.

    A class rather than an async generator: ``aclose`` works whether or not iteration ever
    started (a generator that never ran has no ``finally`` to abort from) and while another task
    is suspended reading it (a generator's ``aclose`` would raise "already running").
    """

    def __init__(
        self,
        request_id: str,
        outputs: asyncio.Queue[RequestOutput],
        abort: Callable[[str], None],
        on_end: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.request_id = request_id
        self._outputs = outputs
        self._abort = abort
        self._on_end = on_end
        self._done = False

    def __aiter__(self) -> OutputStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        try:
            output = await self._outputs.get()
        except BaseException:  # cancelled while waiting: the reader went away
            await self.aclose()
            raise
        if output.finished:
            self._done = True
            self._on_end(self.request_id)
        return output

    async def aclose(self) -> None:
        self._end_early()

    def __del__(self) -> None:  # dropped unread: free its rows all the same
        self._end_early()

    def _end_early(self) -> None:
        if not self._done:
            self._done = True
            self._abort(self.request_id)
            self._on_end(self.request_id)
