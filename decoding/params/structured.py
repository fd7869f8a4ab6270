"""What a request constrains its output to: a JSON schema, a regex, a choice of strings or a grammar.

OpenAI's ``response_format`` (``json_object``, ``json_schema``) and vLLM's ``structured_outputs``
(``json``, ``regex``, ``choice``, ``grammar``) both become one ``StructuredOutput``; ``param`` keeps
the name the user sent, so every error about it names that field. The checks here are the
torch-free, tokenizer-free ones (types, sizes); whether the schema or grammar compiles is the
compiler's answer (``decoding.structured``), given before the request reaches the worker.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from decoding.params.errors import ParameterError
from decoding.params.sizes import check_size

KINDS = ("json", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredOutput:
    """``kind``: json (``value`` a JSON schema dict), regex or grammar (a string), choice (strings)."""

    kind: str
    value: Any
    param: str = "structured_outputs"  # the field the user sent, for error messages
    size_limit: str = "structured_output"  # its SIZE_LIMITS entry: a tool-call grammar is bounded by the tools'

    @cached_property
    def key(self) -> str:
        """The same constraint, however it was written, has one key (the compile cache's); serialised
        once, though both the size check and the cache read it."""
        return json.dumps([self.kind, self.value], sort_keys=True, separators=(",", ":"))

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise ParameterError(f"{self.param} must be one of {', '.join(KINDS)}, got {self.kind!r}", self.param)
        if self.kind == "json" and not isinstance(self.value, dict):
            raise ParameterError(f"{self.param}: a JSON schema must be an object, got {_type(self.value)}", self.param)
        if self.kind in ("regex", "grammar") and not (isinstance(self.value, str) and self.value):
            raise ParameterError(f"{self.param}: the {self.kind} must be a non-empty string", self.param)
        if self.kind == "choice":
            choices = self.value
            if not (isinstance(choices, list) and choices and all(isinstance(c, str) and c for c in choices)):
                raise ParameterError(f"{self.param}: choice must be a non-empty list of non-empty strings", self.param)
            check_size("choice", choices, self.param)
        check_size(self.size_limit, self.key, self.param)


def _type(value: object) -> str:
    return type(value).__name__
