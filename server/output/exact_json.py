"""JSON a client can parse, whatever number a model wrote in its tool arguments.

JSON's grammar allows any exponent: ``{"x": 1e999}`` is valid JSON, and a model (or a schema's
``number``) may write it. Python's ``json.loads`` reads it as ``inf``, and ``json.dumps`` then writes
``Infinity``, which is not JSON: a strict encoder (Starlette's response, ``allow_nan=False``) refuses
it — a non-streamed Messages reply carrying such a call was a 500 — and a lenient one sends text that
JavaScript's ``JSON.parse`` and every strict client reject. Tool arguments are read with ``loads``
instead: a number no float can hold is a ``RawNumber``, a float that keeps the text it was read from,
and ``dumps`` writes that text back, so the number reaches the client as the model wrote it; an
integer too long for Python's ``int`` (over 4300 digits) is kept the same way. ``NaN``, ``Infinity``
and ``-Infinity`` (Python's extension, not JSON) are refused as any invalid JSON is.
``ExactJSONResponse`` is Starlette's strict JSON response that writes such numbers exactly.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from starlette.responses import JSONResponse

_JSON_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


class RawNumber(float):
    """A JSON number kept as its source ``text`` (its float value is what Python would read: ``inf``
    for ``1e999``); ``dumps`` writes the text."""

    text: str

    def __new__(cls, text: str) -> RawNumber:
        if not _JSON_NUMBER.fullmatch(text):
            raise ValueError(f"not a JSON number: {text!r}")
        number = super().__new__(cls, text)
        number.text = text
        return number

    def __repr__(self) -> str:
        return f"RawNumber({self.text!r})"


def _float(text: str) -> float:
    value = float(text)
    return value if math.isfinite(value) else RawNumber(text)


def _int(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
        return RawNumber(text)


def _refuse(name: str) -> Any:  # noqa: ANN401
    raise ValueError(f"{name} is not JSON")


def loads(text: str) -> Any:  # noqa: ANN401
    """``text`` parsed as strict JSON (``ValueError`` when it is not: ``json.JSONDecodeError`` is one),
    its numbers exact as ``dumps`` writes them back."""
    return json.loads(text, parse_float=_float, parse_int=_int, parse_constant=_refuse)


def dumps(value: Any, **options: Any) -> str:  # noqa: ANN401
    """``json.dumps(value, **options)`` that writes each ``RawNumber`` as its text and never a
    non-JSON ``NaN``/``Infinity`` (any other non-finite float is a ``ValueError``)."""
    options["allow_nan"] = False
    try:
        return json.dumps(value, **options)
    except ValueError:  # a RawNumber (or a stray non-finite float: raised again below)
        return _exact(value, options)


def _exact(value: Any, options: dict[str, Any]) -> str:  # noqa: ANN401
    """The slow path: containers walked here, every leaf but a ``RawNumber`` written by ``json.dumps``."""
    item, key = options.get("separators") or (", ", ": ")
    if isinstance(value, RawNumber):
        return value.text
    if isinstance(value, dict):
        return "{" + item.join(json.dumps(str(k), **options) + key + _exact(v, options) for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + item.join(_exact(v, options) for v in value) + "]"
    return json.dumps(value, **options)


class ExactJSONResponse(JSONResponse):
    """Starlette's JSON response (compact, UTF-8, strict) with each ``RawNumber`` written as its text."""

    def render(self, content: Any) -> bytes:  # noqa: ANN401
        return dumps(content, ensure_ascii=False, indent=None, separators=(",", ":")).encode("utf-8")
