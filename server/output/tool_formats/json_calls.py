"""Calls written as plain JSON outside a format's tags, as Qwen 2.5 (Coder above all) and other Hermes-style
models often write them instead of ``<tool_call>`` tags: a fenced block (```` ```json ````, ```` ``` ````,
```` ```tool_call ````) or a bare object ``{"name": "get_weather", "arguments": {...}}``, or a JSON array
of such objects, anywhere in the reply (llama.cpp's Hermes parser reads the same forms).

Nothing but a call may be taken for one, so the test is narrow: the object opens with its ``"name"``, that
name is one of the offered functions, and its only other key is ``arguments`` (or ``parameters``), an object
(or OpenAI's string of one). A JSON example in prose that names no offered tool, an object with other keys,
a code block of unrelated JSON: all stay content. ``head`` tells, as the model writes, whether an object
(or an array's first object) opens like a call, so a stream holds back only text that may still be one.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import Enum

from server.output.exact_json import loads
from server.output.tool_formats.calls import Brackets, ToolCall, named_call

FENCE = "```"
FENCE_LANGUAGES = frozenset({"", "json", "JSON", "tool_call", "tool_calls"})  # a fence whose block may hold calls
ARGUMENT_KEYS = ("arguments", "parameters")
WHITESPACE = " \t\n\r"
HEAD_LIMIT = 256  # characters a head may take (whitespace included) before an undecided text is no call


class Head(Enum):
    """How far a text opening with ``{`` or ``[`` goes toward a call's head ``{"name": "<offered>"``."""

    NOT_CALL = "not a call"
    OPENING = "may open a call"  # ``{``, ``{"na``...: nothing tells yet
    NAMING = "names a function"  # ``{"name": "get_w``: a call on its way, if the name ends as an offered one
    CALL = "a call's head"  # ``{"name": "get_weather"``: read as a call once whole


def head(text: str, names: Collection[str]) -> Head:
    """How ``text`` (an object, or an array whose first item is one) opens, for the offered ``names``; a text
    still undecided after ``HEAD_LIMIT`` characters is no call (so a stream never holds much, nor long)."""
    verdict = _head(text[:HEAD_LIMIT], names)
    if len(text) >= HEAD_LIMIT and verdict in (Head.OPENING, Head.NAMING):
        return Head.NOT_CALL
    return verdict


def _head(text: str, names: Collection[str]) -> Head:
    pos = 0
    if text.startswith("["):
        pos = _skip_space(text, 1)
        if pos == len(text):
            return Head.OPENING
    for piece in ("{", '"name"', ":", '"'):
        pos = _skip_space(text, pos)
        written = text[pos : pos + len(piece)]
        if not piece.startswith(written):
            return Head.NOT_CALL
        if len(written) < len(piece):
            return Head.OPENING
        pos += len(piece)
    name, quote, _ = text[pos:].partition('"')
    if not quote:
        return Head.NAMING if any(offered.startswith(name) for offered in names) else Head.NOT_CALL
    return Head.CALL if name in names else Head.NOT_CALL


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in WHITESPACE:
        pos += 1
    return pos


def json_values(text: str) -> list[str] | None:
    """``text`` cut into its top-level JSON objects and arrays (apart by whitespace, ``,`` or ``;``), or None
    when anything else stands between them (the values themselves are not parsed here)."""
    values, start, brackets = [], None, Brackets()
    for i, char in enumerate(text):
        if start is None:
            if char in WHITESPACE or (char in ",;" and values):
                continue
            if char not in "{[":
                return None
            start = i
        brackets.step(char)
        if brackets.depth == 0 and brackets.outside_strings:
            values.append(text[start : i + 1])
            start = None
    return values if values and start is None else None


def call_object(value: object, names: Collection[str]) -> ToolCall | None:
    """``{"name": <offered>, "arguments" | "parameters": {...}}`` and nothing else, as a call; else None."""
    if not isinstance(value, dict) or len(value) != 2 or "name" not in value:
        return None
    key = next((key for key in ARGUMENT_KEYS if key in value), None)
    return None if key is None else named_call(value["name"], value[key], names)


def json_calls(text: str, names: Collection[str]) -> list[ToolCall] | None:
    """The calls ``text`` is made of (objects or arrays of them, nothing else), or None when any part of it
    is not a call (then all of it is content: a block is calls or text, never half of each)."""
    values = json_values(text)
    if values is None:
        return None
    calls = []
    for value in values:
        try:
            parsed = loads(value)
        except ValueError:
            return None
        items = parsed if isinstance(parsed, list) else [parsed]
        found = [call_object(item, names) for item in items]
        if not found or None in found:
            return None
        calls += found
    return calls


def unfenced(text: str) -> str:
    """A block's text without the fence a model may have put around it inside its tags."""
    stripped = text.strip()
    if not stripped.startswith(FENCE) or not stripped.endswith(FENCE) or len(stripped) < 2 * len(FENCE):
        return text
    inner = stripped[len(FENCE) : -len(FENCE)]
    language, _, body = inner.partition("\n")
    return body if language.strip() in FENCE_LANGUAGES else text
