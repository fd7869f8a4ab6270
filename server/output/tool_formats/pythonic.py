"""The pythonic tool calls of Llama 3.2 and Llama 4's small models (vLLM's ``pythonic``): the reply is a
Python list of calls with keyword arguments, ``[get_weather(city="Oslo"), get_time()]`` (Llama 4 wraps
it in ``<|python_start|>``...``<|python_end|>``).

Arguments are Python literals, read with ``ast`` (never evaluated); JSON's ``true``/``false``/``null``
are read too, since a model trained on JSON writes them inside nested values. A number no float holds
(``1e999``) is kept as written when that is a JSON number (``server.output.exact_json``). The grammar writes each
function's parameters as keywords in the schema's order, the required ones always: a keyword a schema
does not name cannot be written (as under ``strict``, whatever the tool says), since Python's keywords
are not a JSON object a schema's ``additionalProperties`` could bound.
"""

from __future__ import annotations

import ast
import json
import math
from typing import Any

from server.output.exact_json import RawNumber, dumps
from server.output.tool_formats.calls import ToolCall, ToolFormat, literal, named_call
from server.output.tool_formats.leading import CONTENT, END, ITEM, SKIP, LeadingCallsStream

PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
_JSON_NAMES = {"true": True, "false": False, "null": None}


class PythonicStream(LeadingCallsStream):
    HEADS = ("[", PYTHON_START + "[")
    QUOTES = "\"'"
    TAILS = (PYTHON_END,)

    def between(self, char: str) -> str:
        if char.isspace() or char == ",":
            return SKIP
        if char == "]":
            return END
        return ITEM if char.isalpha() or char == "_" else CONTENT

    def item_done(self, char: str) -> bool:
        return char == ")" and self._brackets.depth == 0

    def parse(self, item: str) -> ToolCall | None:
        return python_call(item, self.names)


def python_call(text: str, names: Any = None) -> ToolCall | None:  # noqa: ANN401
    """``name(key=value, ...)`` with literal values, or None."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return None
    if any(keyword.arg is None for keyword in node.keywords):  # **kwargs
        return None
    try:
        arguments = {keyword.arg: _value(keyword.value, text.strip()) for keyword in node.keywords}
        dumps(arguments)
    except (ValueError, TypeError, SyntaxError):
        return None
    return named_call(node.func.id, arguments, names)


def _value(node: ast.expr, source: str) -> Any:  # noqa: ANN401
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise ValueError("** in a dict")
        return {_key(key, source): _value(value, source) for key, value in zip(node.keys, node.values, strict=True)}
    if isinstance(node, ast.List | ast.Tuple):
        return [_value(element, source) for element in node.elts]
    value = ast.literal_eval(node)
    if isinstance(value, float) and not math.isfinite(value):  # 1e999: kept as written (a ValueError unless JSON)
        return RawNumber(ast.get_source_segment(source, node) or "")
    return value


def _key(node: ast.expr | None, source: str) -> str:
    key = _value(node, source) if node is not None else None
    if not isinstance(key, str):
        raise ValueError("a non-string key")
    return key


# ---- the grammar ---------------------------------------------------------------------------------------
def pythonic_rules(rule: str, name: str, arguments: dict[str, Any], style: dict[str, Any]) -> list[str]:
    """``rule``: ``name(k=v, ...)``, the schema's properties in order, each required one present."""
    properties: dict[str, Any] = arguments.get("properties") or {}
    required = set(arguments.get("required") or [])
    if not properties:
        return [f"{rule}: {literal(name + '()')}"]
    lines = [f"{rule}: {literal(name + '(')} {rule}_first0 {literal(')')}"]
    count = len(properties)
    for k, schema in enumerate(properties.values()):
        lines.append(f"{rule}_v{k}: {python_value(schema, style)}")
    for k, key in reversed(list(enumerate(properties))):
        keyword = f"{literal(key + '=')} {rule}_v{k}"
        more_next = f" {rule}_more{k + 1}" if k + 1 < count else ""
        if key in required:  # first: the first keyword written; more: after one was written
            lines.append(f"{rule}_first{k}: {keyword}{more_next}")
            lines.append(f'{rule}_more{k}: ", " {keyword}{more_next}')
        else:
            first_next = f" | {rule}_first{k + 1}" if k + 1 < count else ' | ""'
            lines.append(f"{rule}_first{k}: {keyword}{more_next}{first_next}")
            lines.append(f'{rule}_more{k}: (", " {keyword})?{more_next}')
    return lines


def python_value(schema: Any, style: dict[str, Any]) -> str:  # noqa: ANN401
    """A value valid for ``schema`` as a Python literal: JSON (a JSON string or number is one) except
    for booleans and null, which Python spells True, False and None."""
    if not isinstance(schema, dict):
        return f"%json {json.dumps({'x-guidance': style})}"
    if "const" in schema or "enum" in schema:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        return "(" + " | ".join(literal(_python_literal(value)) for value in values) + ")"
    kind = schema.get("type")
    if isinstance(kind, list):
        return "(" + " | ".join(python_value({**schema, "type": one}, style) for one in kind) + ")"
    if kind == "boolean":
        return '("True" | "False")'
    if kind == "null":
        return '"None"'
    return f"%json {json.dumps({'x-guidance': style, **schema})}"


def _python_literal(value: Any) -> str:  # noqa: ANN401
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(_python_literal, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_python_literal(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


PYTHONIC = ToolFormat(
    name="pythonic",
    stream=PythonicStream,
    markers=(PYTHON_START, "[func_name1("),  # Llama 4's token; the instruction of vLLM's pythonic templates
    call_rules=pythonic_rules,
    opener="[",
    separator=", ",
    closer="]",
    anchored=True,
    plain=r"(([^\[<\s]|<[^|])(.|\n)*)?",
)
