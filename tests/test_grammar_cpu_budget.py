"""The grammar budget counts the masks' own CPU work (the worker thread's CPU time), so a busy machine
never makes a valid request look "too ambiguous". A mask whose thread waits (for a core, for the GIL:
wall-clock time passes, no work is done) is not charged, one that works is, deterministically; then,
for real: CPU burner processes (more than the cores) and a thread of this process that keeps the
interpreter busy (as the event loop beside the worker does) run beside ordinary constraints, walked
token by token through ``apply_grammar_masks`` as the engine masks a request's rows: none is refused;
the ambiguous grammar is still refused under the same load."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from decoding.params.structured import StructuredOutput
from decoding.sampling.grammar import WINDOW_CALLS, GrammarFailure, MaskBudget, RowGrammar, apply_grammar_masks
from decoding.structured.compiler import GrammarCompiler
from server.translate.tools import Tool, call_grammar

EOS, VOCAB, ROWS = 2, 49152, 4
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}  # fmt: skip
AMBIGUOUS = 'start: s\ns: s s | "a"\n'
BURNERS, BURN_LIMIT_S = 3, 120  # each burner ends by itself after BURN_LIMIT_S, whatever happens here


@contextmanager
def busy_machine() -> Iterator[None]:
    """CPU burner processes and a busy Python thread, for the body of the ``with`` (torch on one thread
    meanwhile: its pool's threads, descheduled by the burners, would only slow the test down)."""
    burn = f"import time\nend = time.monotonic() + {BURN_LIMIT_S}\nwhile time.monotonic() < end: pass\n"
    burners = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(BURNERS)]
    stop = threading.Event()

    def keep_busy() -> None:
        while not stop.is_set():
            sum(range(1000))  # pure Python: it holds the GIL whenever the mask's thread gives it up

    busy = threading.Thread(target=keep_busy, daemon=True)
    busy.start()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        stop.set()
        busy.join(10)
        for burner in burners:
            burner.terminate()
        for burner in burners:
            burner.wait(10)


@pytest.fixture(scope="module")
def compiler(smollm2_tokenizer) -> GrammarCompiler:
    return GrammarCompiler(smollm2_tokenizer, VOCAB, [EOS])


def walk(compiler: GrammarCompiler, spec: StructuredOutput, tokens: list[int]) -> int:
    """``tokens`` (then eos) through ``ROWS`` rows of one request, each step masked as the engine masks
    it; the steps walked. A ``GrammarFailure`` (the budget's refusal) propagates."""
    compiled, _ = compiler.compile(spec)
    budget = MaskBudget(spec.param)
    rows = [RowGrammar(compiled.new_matcher(), [EOS], budget) for _ in range(ROWS)]
    for step, token in enumerate([*tokens, EOS]):
        scores = torch.zeros(ROWS, VOCAB)
        apply_grammar_masks(scores, list(range(ROWS)), rows)
        assert bool(torch.isfinite(scores[:, token]).all()), f"{spec.param}: token {token} at step {step} is banned"
        if token == EOS:
            break
        for row in rows:
            row.append(token)
    return step


def ordinary(tokenizer) -> list[tuple[StructuredOutput, list[int]]]:
    """Constraints real clients send, each with a valid reply: the issue's forced call of
    ``{name: string, age: integer}``, JSON schemas, a regex, a choice."""
    person = Tool.model_validate({"type": "function", "function": {"name": "record_person", "parameters": PERSON}})
    cases = [
        (call_grammar([person], "required", parallel=True),
         '<tool_call>\n{"name": "record_person", "arguments": {"name": "Ada Lovelace", "age": 36}}\n</tool_call>'),
        (StructuredOutput("json", PERSON, param="response_format"), '{"name": "Alan Turing", "age": 41}'),
        (StructuredOutput("json", {"type": "object", "properties": {"tags": {"type": "array", "items": {
            "enum": ["red", "green", "blue"]}}, "ok": {"type": "boolean"}, "note": {"type": ["string", "null"]}},
            "required": ["tags", "ok"]}, param="response_format"),
         '{"tags": ["red", "blue", "green", "red"], "ok": true, "note": null}'),
        (StructuredOutput("regex", r"\d{3}-\d{4} [A-Z][a-z]+", param="structured_outputs"), "555-1234 Oslo"),
        (StructuredOutput("choice", ["positive", "negative", "neutral"], param="structured_outputs"), "neutral"),
    ]  # fmt: skip
    return [(spec, tokenizer.encode(text, add_special_tokens=False)) for spec, text in cases]


class Waiting:
    """A matcher whose every mask waits ``seconds`` without working: a thread the machine's load has
    descheduled, or that waits for the GIL."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def is_error(self) -> bool:
        return False

    def unsafe_compute_mask_ptr(self, pointer: int, size: int) -> None:
        time.sleep(self.seconds)


class Working(Waiting):
    """A matcher whose every mask works ``seconds`` of this thread's CPU time."""

    def unsafe_compute_mask_ptr(self, pointer: int, size: int) -> None:
        end = time.thread_time() + self.seconds
        while time.thread_time() < end:
            pass


def masked_steps(matcher: Waiting, steps: int) -> int:
    """``steps`` mask calls of a request's ``ROWS`` rows over ``matcher``; the calls made before a refusal."""
    budget = MaskBudget("response_format")
    rows = [RowGrammar(matcher, [EOS], budget) for _ in range(ROWS)]
    for step in range(steps):
        try:
            apply_grammar_masks(torch.zeros(ROWS, 64), list(range(ROWS)), rows)
        except GrammarFailure as failure:
            assert failure.reason == "budget" and "ms of CPU per step" in str(failure), failure
            return step
    return steps


def test_a_mask_s_wait_is_not_charged_and_its_work_is():
    assert masked_steps(Waiting(0.02), 12) == 12  # 80 ms a call waited (the wall clock's "too ambiguous")
    assert masked_steps(Working(0.002), 12) == WINDOW_CALLS - 1  # 8 ms of work a call: refused at the 8th


@pytest.mark.slow
def test_ordinary_constraints_are_never_refused_on_a_busy_machine(compiler, smollm2_tokenizer):
    cases = ordinary(smollm2_tokenizer)
    for spec, tokens in cases:
        walk(compiler, spec, tokens)  # compiled (and its first masks' lexer states built) before the load
    with busy_machine():
        for spec, tokens in cases:
            assert walk(compiler, spec, tokens) == len(tokens)  # no GrammarFailure, eos allowed at the end


@pytest.mark.slow
def test_the_ambiguous_grammar_is_still_refused_on_a_busy_machine(compiler, smollm2_tokenizer):
    spec = StructuredOutput("grammar", AMBIGUOUS, param="structured_outputs")
    (a,) = smollm2_tokenizer.encode("a", add_special_tokens=False)
    started = time.thread_time()
    with busy_machine(), pytest.raises(GrammarFailure) as failure:
        walk(compiler, spec, [a] * 600)
    assert failure.value.reason == "budget" and "too ambiguous" in str(failure.value)
    assert "of CPU" in str(failure.value) and str(failure.value).startswith("structured_outputs: ")
    assert time.thread_time() - started < 60  # refused long before its 600 tokens' masks (minutes of CPU)


@pytest.mark.parametrize(("vocab_size", "refused"), [(49_152, True), (151_936, False)])
def test_the_per_step_limit_grows_with_the_vocabulary(vocab_size, refused):
    """6.4 ms a step is what an ordinary tool call's masks cost over Qwen2.5's 151,936 tokens on a 2-core
    Xeon: refused as "too ambiguous" under the flat 5 ms (a real agent's call failed with a 400). A mask
    walks the tokens its state allows, so the limit is stated for 50,000 tokens and scales past them; over
    SmolLM2's 49,152 the same cost is still refused."""
    budget = MaskBudget("tools")
    charge = [budget.charge(0.0064, vocab_size) for _ in range(WINDOW_CALLS - 1)]
    assert charge == [None] * (WINDOW_CALLS - 1)  # nothing is judged before a full window
    if refused:
        with pytest.raises(GrammarFailure, match=r"tools: .*\(at most 5 ms\)"):
            budget.charge(0.0064, vocab_size)
    else:
        budget.charge(0.0064, vocab_size)
