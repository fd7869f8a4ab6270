"""A request's constraint compiled once, off the event loop and off the model's step.

llguidance (https://github.com/guidance-ai/llguidance) turns a JSON schema, a regex, a Lark or
GBNF grammar into an Earley parser over the tokenizer's vocabulary; its ``LLMatcher`` answers
"which tokens may come next" for one sequence. Compiling builds the grammar and a first matcher
(1-2 ms for a typical schema on SmolLM2's 49k vocabulary, bounded by ``LIMITS``); every row of
every request with the same constraint then starts from a copy of that matcher (under a
microsecond). Compiled grammars are kept in a bounded LRU cache keyed by the constraint's
canonical JSON, with hit and miss counts for ``/metrics``.

An invalid schema, regex or grammar, a JSON-schema keyword llguidance does not support, or one
that exceeds the limits is a ``ParameterError`` naming the field the user sent.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import llguidance
import llguidance.hf
from llguidance import LLMatcher, LLParserLimits
from llguidance.gbnf_to_lark import any_to_lark

from decoding.params.errors import ParameterError
from decoding.params.structured import StructuredOutput

CACHE_SIZE = 256  # distinct constraints kept compiled
# llguidance's own fuel limits, lowered from its defaults so one grammar cannot hold the compile
# thread (or a mask step) for long: ~20 ms of lexer building, ~5 ms of lexing and ~1.5 ms of
# parsing per mask at its measured speeds
LIMITS = dict(initial_lexer_fuel=1_000_000, step_lexer_fuel=70_000, step_max_items=30_000,
              max_grammar_size=200_000, verbose_errors=False)  # fmt: skip


@dataclass
class CompiledGrammar:
    """One constraint, compiled: each row takes a ``new_matcher()`` of its own."""

    template: LLMatcher
    seconds: float  # what compiling it took

    def new_matcher(self) -> LLMatcher:
        return self.template.deep_copy()


@dataclass
class CompileStats:
    hits: int = 0
    misses: int = 0


class GrammarCompiler:
    """Compiles constraints for one tokenizer; safe to call from several threads."""

    def __init__(self, tokenizer: object, vocab_size: int, eos_token_ids: list[int], cache_size: int = CACHE_SIZE):
        self._hf_tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None  # built at the first constraint (~0.4 s)
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.stats = CompileStats()

    def compile(self, spec: StructuredOutput) -> tuple[CompiledGrammar, bool]:
        """The compiled constraint and whether it came from the cache."""
        key = spec.key
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.stats.hits += 1
                return cached, True
        started = time.perf_counter()
        tokenizer = self.tokenizer()  # a failure here is the server's (a 500), never the request's grammar
        grammar = _grammar_of(spec)
        try:
            template = LLMatcher(tokenizer, grammar, log_level=0, limits=LLParserLimits(**LIMITS))
        except Exception as error:  # llguidance reports grammar errors in the matcher; anything else is the input's
            raise ParameterError(f"{spec.param}: {_reason(str(error))}", spec.param, "invalid_grammar") from error
        if template.is_error():
            raise ParameterError(f"{spec.param}: {_reason(template.get_error())}", spec.param, "invalid_schema")
        compiled = CompiledGrammar(template, time.perf_counter() - started)
        with self._lock:
            self.stats.misses += 1
            self._cache[key] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled, False

    def tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the served tokenizer, built once; ``GrammarTokenizerError`` if it cannot be."""
        with self._lock:
            if self._tokenizer is None:
                eos = self._eos[0] if len(self._eos) == 1 else self._eos
                try:
                    self._tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer, n_vocab=self._vocab_size,
                                                                   eos_token=eos)  # fmt: skip
                except Exception as error:
                    raise GrammarTokenizerError(f"llguidance cannot read this tokenizer: {error}") from error
            return self._tokenizer


class GrammarTokenizerError(RuntimeError):
    """The served tokenizer cannot be turned into llguidance's: a server fault (HTTP 500), not the request's."""


def _grammar_of(spec: StructuredOutput) -> str:
    """llguidance's grammar text for the constraint (schema validity is checked when it compiles)."""
    if spec.kind == "json":
        # whitespace as a compact JSON writer puts it: a small model given free whitespace may loop on it
        options = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        try:
            return LLMatcher.grammar_from_json_schema(spec.value, defaults=options)
        except ValueError as error:
            raise ParameterError(f"{spec.param}: {_reason(str(error))}", spec.param, "invalid_schema") from error
    try:
        if spec.kind == "regex":
            return LLMatcher.grammar_from_regex(spec.value)
        if spec.kind == "choice":
            alternatives = " | ".join(json.dumps(choice) for choice in spec.value)
            return LLMatcher.grammar_from_lark(f"start: {alternatives}\n")
    except Exception as error:
        raise ParameterError(f"{spec.param}: {_reason(str(error))}", spec.param, "invalid_grammar") from error
    try:
        return LLMatcher.grammar_from_lark(any_to_lark(spec.value))  # Lark as it is, GBNF (::=) translated
    except Exception as error:  # the GBNF translator raises its own errors
        raise ParameterError(f"{spec.param}: {_reason(str(error))}", spec.param, "invalid_grammar") from error


def _reason(message: str) -> str:
    """llguidance's message without its source-position preamble, on one line."""
    return " ".join(message.split())[:500]
