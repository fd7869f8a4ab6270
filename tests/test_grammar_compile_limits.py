"""The compile side of a constraint's limits: the time limit counts a compile, not its wait behind
others on the one grammar thread; a tokenizer llguidance cannot read is the server's fault (500),
never the request's ``invalid_grammar``."""

from __future__ import annotations

import asyncio
import time

import pytest

import decoding.engine.client as engine_client
from decoding import GenerationParams, ParameterError
from decoding.params.structured import StructuredOutput
from decoding.structured.compiler import GrammarCompiler, GrammarTokenizerError
from tests.scripted_engine import scripted_client


class SlowCompiler:
    """Every compile takes ``seconds``; one at a time, like the real grammar thread."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def compile(self, spec: StructuredOutput) -> tuple[object, bool]:
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


def test_a_tokenizer_llguidance_cannot_read_is_a_server_error():
    compiler = GrammarCompiler(object(), 100, [2])  # not a tokenizer at all
    with pytest.raises(GrammarTokenizerError) as error:
        compiler.compile(StructuredOutput("regex", "[0-9]+"))
    assert not isinstance(error.value, ParameterError)  # the HTTP layer answers 500, not 400 invalid_grammar
