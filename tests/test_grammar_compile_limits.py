"""The compile side of a constraint's limits: the time limit counts a compile, not its wait behind
others on the one grammar thread nor the one-time build of llguidance's tokenizer (built at start,
seconds for a 150k-token vocabulary on a busy CPU); a tokenizer llguidance cannot read is the
server's fault (500), never the request's ``invalid_grammar``."""

from __future__ import annotations

import asyncio
import time

import pytest

import decoding.engine.client as engine_client
from decoding import GenerationParams, ParameterError
from decoding.engine.client import WorkerEngineClient
from decoding.engine.worker import Worker
from decoding.params.model_checks import ModelFacts
from decoding.params.structured import StructuredOutput
from decoding.structured.compiler import GrammarCompiler, GrammarTokenizerError
from tests.scripted_engine import WORDS, ScriptedEngine, WordTokenizer, scripted_client, wait_for


class SlowCompiler:
    """Every compile takes ``seconds``; one at a time, like the real grammar thread."""

    def __init__(self, seconds: float, build: float = 0.0) -> None:
        self.seconds = seconds
        self.build = build  # the tokenizer's one-time build, as GrammarCompiler.tokenizer does it at first use
        self.built = False

    def tokenizer(self) -> object:
        if not self.built:
            time.sleep(self.build)
            self.built = True
        return object()

    def compile(self, spec: StructuredOutput) -> tuple[object, bool]:
        self.tokenizer()
        time.sleep(self.seconds)
        return type("Compiled", (), {"seconds": self.seconds})(), False


def test_the_compile_time_limit_does_not_count_the_queue(monkeypatch):
    monkeypatch.setattr(engine_client, "COMPILE_TIMEOUT_S", 0.6)
    client = scripted_client()
    client._compiler = SlowCompiler(0.3)  # four queued: the last waits 0.9 s, compiles for 0.3 s
    specs = [GenerationParams(structured_output=StructuredOutput("regex", f"a{i}")) for i in range(4)]

    async def go() -> list:
        return await asyncio.gather(*(client.compile_structured_output(params) for params in specs))

    try:
        assert all(params.compiled_grammar is not None for params in asyncio.run(go()))
        client._compiler = SlowCompiler(0.9)  # one compile over the limit is still refused, naming the field
        with pytest.raises(ParameterError) as error:
            asyncio.run(client.compile_structured_output(specs[0]))
        assert error.value.param == "structured_outputs"
    finally:
        client.worker.stop(5.0)


def test_the_compile_time_limit_does_not_count_building_the_tokenizer(monkeypatch):
    """The first constraint after start on Qwen 2.5's vocabulary was refused when the tokenizer's build
    (~6-9 s on a busy 2-core machine) and the compile together passed the limit."""
    monkeypatch.setattr(engine_client, "COMPILE_TIMEOUT_S", 0.6)
    client = scripted_client()
    client._compiler = SlowCompiler(0.1, build=0.9)
    try:
        asked = GenerationParams(structured_output=StructuredOutput("regex", "a"))
        params = asyncio.run(client.compile_structured_output(asked))
        assert params.compiled_grammar is not None
    finally:
        client.worker.stop(5.0)


def test_the_grammar_tokenizer_is_built_at_start():
    compiler = SlowCompiler(0.0, build=0.1)
    worker, _ = Worker.spawn(lambda: (ScriptedEngine(), None))
    facts = ModelFacts(vocab_size=len(WORDS), max_model_len=1000)
    client = WorkerEngineClient(worker, WordTokenizer(), served_name="scripted", facts=facts, max_queue=4,
                                has_chat_template=True, compiler=compiler)  # fmt: skip
    try:
        wait_for(lambda: compiler.built)  # before any request asked for a constraint
    finally:
        client.worker.stop(5.0)


def test_a_tokenizer_llguidance_cannot_read_is_a_server_error():
    compiler = GrammarCompiler(object(), 100, [2])  # not a tokenizer at all
    with pytest.raises(GrammarTokenizerError) as error:
        compiler.compile(StructuredOutput("regex", "[0-9]+"))
    assert not isinstance(error.value, ParameterError)  # the HTTP layer answers 500, not 400 invalid_grammar
