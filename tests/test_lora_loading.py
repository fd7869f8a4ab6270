"""Runtime LoRA loading through the real engine client (a tiny Llama on its worker thread): a folder is read
off the engine's thread while generation goes on, one folder loaded under two names keeps one float32
copy, and ``--max-loaded-loras`` unloads the least recently used idle adapter (never one with requests
in flight, never one of ``--lora-modules``), or refuses with ``LoraLimitError`` when all are busy."""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Iterator

import pytest
import torch

from decoding import GenerationParams, LoraLimitError, ParameterError
from decoding.engine import lora as engine_lora
from decoding.engine.client import WorkerEngineClient
from decoding.engine.core import Engine
from decoding.engine.limits import EngineLimits
from decoding.engine.lora import LoraLimits
from decoding.engine.worker import Worker
from decoding.params.model_checks import ModelFacts
from tests.engine_harness import as_served, tiny_llama
from tests.test_lifecycle_disconnect import byte_level_tokenizer
from tests.test_lora_engine import make_adapter

GREEDY = GenerationParams(max_new_tokens=6, ignore_eos=True)
LONG = GenerationParams(max_new_tokens=200, ignore_eos=True)
PROMPT = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def tokenizer():
    return byte_level_tokenizer()


@pytest.fixture(scope="module")
def base(tokenizer):
    return tiny_llama(len(tokenizer), seed=11)


@pytest.fixture(scope="module")
def folders(base, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-loading")
    for seed, name in enumerate(("pinned", "a", "b", "c", "d"), start=1):
        make_adapter(base, root / name, seed=seed, b_std=0.5)
    return root


@pytest.fixture
def client(base, tokenizer, folders) -> Iterator[WorkerEngineClient]:
    """The engine with ``pinned`` loaded at start (as ``--lora-modules``), 4 slots, 2 runtime adapters at most."""
    eos = tokenizer.eos_token_id

    def build() -> tuple:
        limits = EngineLimits(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=128)
        engine = Engine(as_served(base), copy.deepcopy(tokenizer), [eos], limits, lambda _: None,
                        torch.device("cpu"), lora=LoraLimits(4, 16))  # fmt: skip
        engine.loras.load("pinned", str(folders / "pinned"))
        return engine, None

    worker, _ = Worker.spawn(build)
    facts = ModelFacts(vocab_size=len(tokenizer), max_model_len=256, num_layers=2, max_num_seqs=8)
    yield WorkerEngineClient(worker, tokenizer, "tiny", facts, max_queue=16, has_chat_template=False,
                             max_loaded_loras=2)  # fmt: skip
    worker.stop(10)


async def tokens(client: WorkerEngineClient, request_id: str, params: GenerationParams) -> list[int]:
    out = []
    async for output in client.generate(request_id, PROMPT, params):
        assert output.error is None, output.error
        out += [t for delta in output.deltas for t in delta.token_ids]
    return out


def test_one_folder_under_two_names_keeps_one_copy(client, folders):
    async def go() -> tuple[list[int], list[int], list[int]]:
        await client.load_lora_adapter("a", str(folders / "a"))
        await client.load_lora_adapter("same-as-a", str(folders / "a"))
        known = client.worker.engine.loras.residency.known
        assert known["same-as-a"].matrices is known["a"].matrices  # previous main: a second float32 copy
        first, second = await tokens(client, "1", GREEDY.replace(lora_name="a")), await tokens(
            client, "2", GREEDY.replace(lora_name="same-as-a"))  # fmt: skip
        await client.unload_lora_adapter("a")
        return first, second, await tokens(client, "3", GREEDY.replace(lora_name="same-as-a"))

    first, second, after = asyncio.run(go())
    assert first == second == after  # the same weights, whichever name; unloading one keeps the other
    known = client.worker.engine.loras.residency.known
    shared = known["same-as-a"].matrices
    # loaded again after "a" was unloaded: still the one copy "same-as-a" holds
    asyncio.run(client.load_lora_adapter("a-again", str(folders / "a")))
    again = client.worker.engine.loras.residency.known["a-again"].matrices
    assert all(again[m][0].data_ptr() == shared[m][0].data_ptr() for m in shared)
    assert all(again[m][1].data_ptr() == shared[m][1].data_ptr() for m in shared)


def test_the_cap_unloads_the_least_recently_used_idle_adapter_and_refuses_when_all_are_busy(client, folders):
    async def go() -> None:
        await client.load_lora_adapter("a", str(folders / "a"))
        await client.load_lora_adapter("b", str(folders / "b"))
        await tokens(client, "use-a", GREEDY.replace(lora_name="a"))  # b is now the least recently used
        await client.load_lora_adapter("c", str(folders / "c"))  # previous main: no cap, all three stay
        assert client.lora_names() == ["pinned", "a", "c"]  # "pinned" (--lora-modules) is never counted
        with pytest.raises(ParameterError, match="'b' does not exist"):
            await tokens(client, "use-b", GREEDY.replace(lora_name="b"))
        assert sorted(client.worker.engine.loras.residency.known) == ["a", "c", "pinned"]

        busy = [client.generate("busy-a", PROMPT, LONG.replace(lora_name="a")),
                client.generate("busy-c", PROMPT, LONG.replace(lora_name="c"))]  # fmt: skip
        await asyncio.gather(*(anext(stream) for stream in busy))  # both running
        with pytest.raises(LoraLimitError, match="--max-loaded-loras"):
            await client.load_lora_adapter("d", str(folders / "d"))
        assert client.lora_names() == ["pinned", "a", "c"]  # nothing unloaded under a running request
        await busy[1].aclose()  # c's request ends: c is idle, and the least recently used idle one
        await client.load_lora_adapter("d", str(folders / "d"))
        assert client.lora_names() == ["pinned", "a", "d"]
        await busy[0].aclose()
        assert await tokens(client, "use-d", GREEDY.replace(lora_name="d"))

    asyncio.run(go())


def test_the_folder_is_read_off_the_engine_thread_while_generation_goes_on(client, folders, monkeypatch):
    reading, release, threads = threading.Event(), threading.Event(), []
    read = engine_lora.read_adapter

    def slow_read(*args: object, **kwargs: object):  # noqa: ANN202
        threads.append(threading.current_thread().name)
        reading.set()
        release.wait(60)
        return read(*args, **kwargs)

    monkeypatch.setattr(engine_lora, "read_adapter", slow_read)

    async def go() -> list[int]:
        load = asyncio.ensure_future(client.load_lora_adapter("a", str(folders / "a")))
        assert await asyncio.to_thread(reading.wait, 30)
        # the read is held: a generation on the base model runs to its end all the same (previous main read
        # the folder on the worker thread, between two steps, so no step ran until it was done)
        done = await asyncio.wait_for(tokens(client, "meanwhile", GREEDY), 30)
        release.set()
        await load
        return done

    assert len(asyncio.run(go())) == GREEDY.max_new_tokens
    assert threads and threads[0] != "decoda-worker"
    assert "a" in client.lora_names()
