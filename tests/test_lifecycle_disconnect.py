"""A client that hangs up on a stream of several engine requests (a list prompt, n > 1) aborts every
one of them, raises nothing, and, with the real engine, frees every row within one step."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from server.app import create_app
from server.config.settings import Settings
from tests.asgi_driver import stream_then_hang_up
from tests.fake_engine import FakeEngineClient


def no_errors_logged(caplog: pytest.LogCaptureFixture) -> None:
    problems = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not problems, [r.getMessage() for r in problems]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": ["hello", "world foo", "bar"], "temperature": 0}),
        ("/v1/completions", {"prompt": ["hello", "world foo"], "n": 2, "temperature": 0.5}),
        ("/v1/completions", {"prompt": "hello", "n": 3, "temperature": 0.5}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}], "n": 2, "temperature": 0.5}),
    ],
    ids=["list-prompt", "list-prompt-n2", "n3", "chat-n2"],
)
def test_hanging_up_aborts_every_engine_request_quietly(path, body, caplog):
    caplog.set_level(logging.DEBUG)
    engine = FakeEngineClient(delay=0.01)
    app = create_app(Settings(), engine_client=engine)
    chunks = asyncio.run(stream_then_hang_up(app, path, {**body, "max_tokens": 50, "stream": True}))
    assert chunks and b"[DONE]" not in b"".join(chunks)
    submitted = {request_id for request_id, _, _ in engine.submitted}
    assert submitted and set(engine.aborted) == submitted and not engine.finished
    no_errors_logged(caplog)


# ---- the real engine behind the real app ----------------------------------------------------------------
def byte_level_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(["the quick brown fox jumps over the lazy dog " * 20], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")


@pytest.fixture
def real_engine_client():
    """A WorkerEngineClient around the real Engine on a tiny random Llama, built on its worker thread."""
    import copy

    import torch

    from decoding.engine.client import WorkerEngineClient
    from decoding.engine.core import Engine
    from decoding.engine.limits import EngineLimits
    from decoding.engine.worker import Worker
    from decoding.params.model_checks import ModelFacts
    from tests.engine_harness import as_served, tiny_llama

    tokenizer = byte_level_tokenizer()
    eos = tokenizer.eos_token_id
    limits = EngineLimits(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=128)

    def build() -> tuple:
        model = as_served(tiny_llama(len(tokenizer), seed=3))
        return Engine(model, copy.deepcopy(tokenizer), [eos], limits, lambda _: None, torch.device("cpu")), None

    worker, _ = Worker.spawn(build)
    facts = ModelFacts(vocab_size=len(tokenizer), max_model_len=256, num_layers=2, max_num_seqs=8)
    client = WorkerEngineClient(worker, tokenizer, "tiny", facts, max_queue=16, has_chat_template=False)
    yield client
    worker.stop(10)


def test_hanging_up_frees_every_row_within_one_step(real_engine_client, caplog):
    caplog.set_level(logging.DEBUG)
    client = real_engine_client
    engine, worker = client.worker.engine, client.worker
    steps = {"count": 0, "at_last_abort": None}
    lock = threading.Lock()
    step, abort = engine.step, worker.abort

    def counting_step() -> None:
        step()
        with lock:
            steps["count"] += 1

    def recording_abort(request_id: str) -> None:
        with lock:
            steps["at_last_abort"] = steps["count"]
        abort(request_id)

    engine.step = counting_step
    worker.abort = recording_abort
    app = create_app(Settings(), engine_client=client)
    body = {"prompt": ["the quick brown fox", "the lazy dog"], "n": 2, "max_tokens": 200, "temperature": 0.8,
            "ignore_eos": True, "stream": True}  # fmt: skip

    async def hang_up_then_wait() -> list[bytes]:
        chunks = await stream_then_hang_up(app, "/v1/completions", body, after_chunks=3)
        for _ in range(500):
            if not engine.requests and engine.pool.usage == 0:
                break
            await asyncio.sleep(0.01)
        return chunks

    chunks = asyncio.run(hang_up_then_wait())
    assert len(chunks) == 3 and steps["at_last_abort"] is not None
    assert not engine.requests and engine.pool.usage == 0  # every row of both prompts' requests freed
    assert engine.pool.num_free == engine.pool.num_slots
    with lock:
        assert steps["count"] - steps["at_last_abort"] <= 1  # at most the step that was running
    no_errors_logged(caplog)
