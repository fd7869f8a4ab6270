"""A real Worker and WorkerEngineClient around a scripted engine: the lifecycle without a model.

``ScriptedEngine`` is just enough of ``decoding.engine.Engine`` for the worker loop (requests,
scheduler.num_waiting, emit, add_request, has_work, step, abort, fail_all): each step emits one
word per running request. Tests inject faults into it (``crash``, ``gate``) on the worker thread.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from decoding.engine.client import WorkerEngineClient
from decoding.engine.worker import Worker
from decoding.outputs import FinishReason, RequestOutput, SequenceDelta
from decoding.params import GenerationParams
from decoding.params.model_checks import ModelFacts

WORDS = ["<eos>", "hello", "world"] + [f"w{i}" for i in range(97)]


class WordTokenizer:
    """What the engine client asks of a tokenizer, on words; ``delay`` makes encoding slow."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        time.sleep(self.delay)
        return [WORDS.index(w) if w in WORDS else 3 for w in text.split()]

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool, tokenize: bool) -> list[int]:
        return [t for m in messages for t in self.encode(m["content"])] + [1]

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(WORDS[t] for t in token_ids)


class ScriptedEngine:
    def __init__(self, step_seconds: float = 0.002) -> None:
        self.step_seconds = step_seconds
        self.requests: dict[str, list[int]] = {}  # request id -> [tokens left, prompt length, generated]
        self.scheduler = SimpleNamespace(num_waiting=0)
        self.emit = None
        self.crash = False  # has_work raises on the worker thread: the loop dies
        self.gate: threading.Event | None = None  # when set, step waits for it
        self.stepping = threading.Event()  # set while a step waits at the gate
        self.fail_all_codes: list[str] = []

    def add_request(self, request_id: str, prompt_ids: list[int], params: GenerationParams) -> None:
        self.requests[request_id] = [params.max_new_tokens, len(prompt_ids), 0]

    def has_work(self) -> bool:
        if self.crash:
            raise RuntimeError("injected fault: the worker loop dies")
        return bool(self.requests)

    def step(self) -> None:
        if self.gate is not None:
            self.stepping.set()
            self.gate.wait()
        time.sleep(self.step_seconds)
        for request_id, state in list(self.requests.items()):
            state[0] -= 1
            state[2] += 1
            last = state[0] == 0
            delta = SequenceDelta(0, " w5", [8], finish_reason=FinishReason.LENGTH if last else None)
            if last:
                del self.requests[request_id]
            self.emit(RequestOutput(request_id, [delta], state[1], state[2], finished=last))

    def abort(self, request_id: str) -> None:
        if self.requests.pop(request_id, None) is not None:
            self.emit(RequestOutput(request_id, finished=True))

    def fail_all(self, message: str, code: str = "internal") -> None:
        self.fail_all_codes.append(code)
        for request_id in list(self.requests):
            del self.requests[request_id]
            self.emit(RequestOutput(request_id, finished=True, error=message, error_code=code))


def scripted_client(engine: ScriptedEngine | None = None, tokenizer: object | None = None) -> WorkerEngineClient:
    worker, _ = Worker.spawn(lambda: (engine or ScriptedEngine(), None))
    return WorkerEngineClient(
        worker,
        tokenizer or WordTokenizer(),
        served_name="scripted",
        facts=ModelFacts(vocab_size=len(WORDS), max_model_len=100_000),
        max_queue=64,
        has_chat_template=True,
    )


def wait_for(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)
