"""The only bridge between the asyncio event loop and the worker thread.

``generate`` checks admission synchronously (so a full queue is a 429 before any byte is sent),
then returns an async iterator fed by ``loop.call_soon_threadsafe`` from the worker. Closing the
iterator before the request finished (a client disconnect) aborts it in the worker.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

from decoding.client_api import EngineClient, EngineUnavailableError, QueueFullError, ServedModel
from decoding.outputs import RequestOutput
from decoding.params import GenerationParams, ParameterError, Strategy
from decoding.worker import Worker


class WorkerEngineClient(EngineClient):
    def __init__(
        self,
        worker: Worker,
        tokenizer: object,
        served_name: str,
        max_model_len: int,
        max_queue: int,
        vocab_size: int,
        has_chat_template: bool,
        assistants: list[ServedModel] | None = None,
        generation_defaults: dict | None = None,
        max_num_seqs: int = 16,
        max_num_beams: int = 8,
        num_layers: int | None = None,
        default_assistant: str | None = None,
    ) -> None:
        self._default_assistant = default_assistant
        self._num_layers = num_layers
        self._max_num_seqs = max_num_seqs
        self._max_num_beams = max_num_beams
        self.worker = worker
        self.tokenizer = tokenizer
        self._served_name = served_name
        self._max_model_len = max_model_len
        self._max_queue = max_queue
        self._vocab_size = vocab_size
        self._has_chat_template = has_chat_template
        self._assistants = assistants or []
        # the model's generation_config.json values; requests override them, they override server defaults
        self.generation_defaults = dict(generation_defaults or {})
        self._draining = False
        self._lock = threading.Lock()

    # ---- model facts -------------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self._served_name

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def served_models(self) -> list[ServedModel]:
        return [ServedModel(self._served_name, "target", self._max_model_len), *self._assistants]

    def is_ready(self) -> bool:
        return self.worker.alive and not self._draining

    # ---- text ----------------------------------------------------------------------------------------
    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def apply_chat_template(self, messages: list[dict[str, str]]) -> list[int]:
        if not self._has_chat_template:
            raise ParameterError(
                f"model '{self._served_name}' has no chat template (it is a base model); "
                "use /v1/completions with a plain prompt instead",
                param="messages",
                code="chat_template_missing",
            )
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def check_params(self, params: GenerationParams) -> None:
        def check_ids(ids: list[int], param: str) -> None:
            for token_id in ids:
                if not 0 <= token_id < self._vocab_size:
                    raise ParameterError(
                        f"{param} contains token id {token_id}, outside the vocabulary [0, {self._vocab_size})",
                        param=param,
                    )

        check_ids([t for words in params.bad_words_ids or [] for t in words], "bad_words_ids")
        check_ids(params.suppress_tokens or [], "suppress_tokens")
        check_ids(list(params.logit_bias or {}), "logit_bias")
        check_ids(params.stop_token_ids, "stop_token_ids")
        if params.num_beams > self._max_num_beams:
            raise ParameterError(
                f"num_beams must be at most {self._max_num_beams} on this server (--max-num-beams), "
                f"got {params.num_beams}",
                param="num_beams",
            )
        if isinstance(params.dola_layers, list) and self._num_layers is not None:
            num_layers = self._num_layers
            for layer in params.dola_layers:
                if not 0 <= layer <= num_layers:
                    raise ParameterError(
                        f"dola_layers entries must be in [0, {num_layers}] for this model, got {layer}",
                        param="dola_layers",
                    )
            if not any(layer < num_layers for layer in params.dola_layers):
                raise ParameterError(
                    f"dola_layers needs at least one premature layer below {num_layers} (the final layer)",
                    param="dola_layers",
                )
        exit_layer = params.assistant_early_exit
        if exit_layer is not None and self._num_layers is not None and not 1 <= exit_layer <= self._num_layers - 1:
            raise ParameterError(
                f"assistant_early_exit must be in [1, {self._num_layers - 1}] for this model, got {exit_layer}",
                param="assistant_early_exit",
            )
        rows, field_name = (params.num_beams, "num_beams") if params.num_beams > 1 else (params.n, "n")
        if rows > self._max_num_seqs:
            raise ParameterError(
                f"{field_name} ({rows}) needs more rows than the server's batch holds (--max-num-seqs "
                f"{self._max_num_seqs})",
                param=field_name,
            )
        known = {m.name for m in self._assistants}
        if params.assistant_model is not None and params.assistant_model not in known:
            raise ParameterError(
                f"unknown assistant_model '{params.assistant_model}'; served assistants: {sorted(known) or 'none'}",
                param="assistant_model",
                code="model_not_found",
            )

    # ---- generation ----------------------------------------------------------------------------------
    def generate(
        self, request_id: str, prompt_ids: list[int], params: GenerationParams
    ) -> AsyncIterator[RequestOutput]:
        if self._default_assistant is not None and params.strategy in (Strategy.GREEDY, Strategy.SAMPLE):
            params = params.replace(assistant_model=self._default_assistant)  # --default-assistant
        with self._lock:
            if self._draining or not self.worker.alive:
                raise EngineUnavailableError("the server is shutting down" if self._draining else "worker stopped")
            if self.worker.num_pending >= self._max_queue:
                raise QueueFullError(f"the waiting queue is full ({self._max_queue} requests); retry later")
            loop = asyncio.get_running_loop()
            outputs: asyncio.Queue[RequestOutput] = asyncio.Queue()

            def sink(output: RequestOutput) -> None:
                loop.call_soon_threadsafe(outputs.put_nowait, output)

            self.worker.submit(request_id, list(prompt_ids), params, sink)
        return self._stream(request_id, outputs)

    async def _stream(self, request_id: str, outputs: asyncio.Queue[RequestOutput]) -> AsyncIterator[RequestOutput]:
        finished = False
        try:
            while not finished:
                output = await outputs.get()
                finished = output.finished
                yield output
        finally:
            if not finished:
                self.worker.abort(request_id)

    async def abort(self, request_id: str) -> None:
        self.worker.abort(request_id)

    async def shutdown(self, drain_timeout: float = 30.0) -> None:
        """Stop admitting, let in-flight requests finish up to ``drain_timeout``, then stop."""
        self._draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_timeout
        while self.worker.num_active and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.to_thread(self.worker.stop, 10.0)
