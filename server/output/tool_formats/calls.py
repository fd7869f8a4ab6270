"""What every tool-call format shares: a call, the check that makes JSON a call, the streamed
parser's interface, and the table entry a format is (its parser, its chat templates' markers and
the pieces of its grammar).

A format's parser is a stream (``feed`` text deltas, then ``finish``) so that a whole reply and a
streamed one are read by the same rules (``parse_whole``). What counts as a call, as OpenAI's own
parser would have it: a function among the offered ones (``names``) with an object for arguments;
anything else stays content. A reply cut short (``finish(truncated=True)``) keeps every call it
finished and drops the one it was cut in (a call is finished when its arguments' JSON is whole: the
format's closing marker after it carries nothing). Arguments are read and written with
``server.output.exact_json``: a number no float holds (``1e999``) stays as the model wrote it, never
``Infinity``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

from server.output.exact_json import dumps, loads


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def named_call(name: Any, arguments: Any, names: Collection[str] | None) -> ToolCall | None:  # noqa: ANN401
    """A call when ``name`` is an offered function and ``arguments`` an object (or OpenAI's string of one)."""
    if not isinstance(name, str) or (names is not None and name not in names):
        return None
    if isinstance(arguments, str):  # some models write OpenAI's string form
        try:
            parsed = loads(arguments)
        except ValueError:
            return None
        return ToolCall(name, arguments) if isinstance(parsed, dict) else None
    return ToolCall(name, dumps(arguments)) if isinstance(arguments, dict) else None


def parse_call(body: str, names: Collection[str] | None = None) -> ToolCall | None:
    """A call's JSON ``{"name": ..., "arguments" (or "parameters"): {...}}``, or None when it is not one."""
    try:
        call = loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict):
        return None
    return named_call(call.get("name"), call.get("arguments", call.get("parameters", {})), names)


def parse_arguments(name: str, body: str, names: Collection[str] | None) -> ToolCall | None:
    """A call whose name the format writes outside its JSON (Mistral's ``[ARGS]``, harmony's recipient)."""
    try:
        arguments = loads(body)
    except ValueError:
        return None
    return named_call(name, arguments, names)


class ToolStream(Protocol):
    """Feed text deltas; get (content to release, calls completed) for each, then for the end."""

    def feed(self, text: str) -> tuple[str, list[ToolCall]]: ...

    def finish(self, truncated: bool = False) -> tuple[str, list[ToolCall]]: ...


ParserFactory = Callable[[], ToolStream]
StreamClass = Callable[[Collection[str] | None], ToolStream]  # PARSERS' values: offered names -> a stream


class ModeStream:
    """A streamed parser written as a state machine: ``_mode`` names the method (``_<mode>``) that
    reads ``_pending`` from the front and returns ``(content, calls)``, or None to wait for more."""

    _pending: str
    _mode: str

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self._pending += text
        content, calls = "", []
        while self._pending:
            step = getattr(self, f"_{self._mode}")()
            if step is None:
                break
            content, calls = content + step[0], calls + step[1]
        return content, calls


def parse_whole(text: str, parser: ParserFactory, truncated: bool = False) -> tuple[str | None, list[ToolCall]]:
    """A whole reply through a stream parser: the same rules, streamed or not. Beside calls, the
    content is trimmed (None when empty: OpenAI's ``content: null``); without calls it is the text
    as streamed."""
    stream = parser()
    content, calls = stream.feed(text)
    more_content, more_calls = stream.finish(truncated)
    content, calls = content + more_content, calls + more_calls
    if not calls:
        return content, calls
    return (content.strip() or None), calls


def partial_marker(text: str, markers: Collection[str]) -> int:
    """Length of the longest tail of ``text`` that may begin one of ``markers`` (held back from content)."""
    for size in range(min(len(text), max(map(len, markers)) - 1), 0, -1):
        if any(marker.startswith(text[-size:]) for marker in markers):
            return size
    return 0


def before_partial_marker(text: str, markers: Collection[str]) -> str:
    """``text`` less the tail that may begin one of ``markers`` (a closing marker a cut left unfinished)."""
    return text[: len(text) - partial_marker(text, markers)]


class Brackets:
    """Nesting depth of ``([{`` outside string literals, one character at a time; its state is kept
    between deltas so a call split anywhere is scanned once (linear in the reply's length)."""

    def __init__(self, quotes: str = '"') -> None:
        self.quotes = quotes  # JSON: ", Python: " and '
        self.depth = 0
        self.quote: str | None = None
        self.escaped = False

    def step(self, char: str) -> None:
        if self.quote is not None:
            if self.escaped:
                self.escaped = False
            elif char == "\\":
                self.escaped = True
            elif char == self.quote:
                self.quote = None
        elif char in self.quotes:
            self.quote = char
        elif char in "([{":
            self.depth += 1
        elif char in ")]}":
            self.depth -= 1

    @property
    def outside_strings(self) -> bool:
        return self.quote is None


CallRules = Callable[[str, str, dict[str, Any], dict[str, Any]], list[str]]


@dataclass(frozen=True)
class ToolFormat:
    """One family's way of writing calls: how they are read and how the grammar that forces them is built.

    The grammar (``server.translate.tools``) writes ``opener call (separator call)* closer`` for
    "required" or a named function (``opener call closer (separator opener call closer)*`` when
    ``call_per_group``: each call has its own tags); ``call_rules(rule, name, arguments_schema,
    json_style)`` gives the llguidance Lark lines defining ``rule`` as one call of ``name`` (helper
    rules prefixed ``rule``).
    A ``json_calls`` format's calls may also be written as JSON outside its tags (fenced or bare, naming
    an offered tool: ``json_calls``); its grammar under "auto" then also opens a call wherever the model
    writes ``{"name": "<offered>"``.
    Under "auto", an ``anchored`` format's calls can only open the reply (a reply that does not start
    with them matches ``plain``, a regex); any other's open wherever the model writes ``opener``
    (llguidance's lazy lexeme: free text until that trigger, then a call that must be valid).
    """

    name: str
    stream: StreamClass
    markers: tuple[str, ...]  # what its chat templates write, to recognise them (``--tool-call-parser auto``)
    call_rules: CallRules
    opener: str = ""
    separator: str = ""
    closer: str = ""
    call_per_group: bool = False
    json_calls: bool = False
    anchored: bool = False
    plain: str = ""  # anchored formats: the regex of a reply that does not open with a call


def literal(text: str) -> str:
    """``text`` as a Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def json_call_rules(arguments_key: str | None, before: str = "", after: str = "") -> CallRules:
    """A call written as one JSON object ``{"name": NAME, arguments_key: {...}}`` (or, with no
    ``arguments_key``, the arguments object alone, the name being written outside it), between
    ``before`` and ``after``."""

    def rules(rule: str, name: str, arguments: dict[str, Any], style: dict[str, Any]) -> list[str]:
        if arguments_key is None:
            schema = {"x-guidance": style, **arguments}
        else:
            schema = {"x-guidance": style, "type": "object", "additionalProperties": False,
                      "properties": {"name": {"const": name}, arguments_key: arguments},
                      "required": ["name", arguments_key]}  # fmt: skip
        parts = [literal(before.replace("{name}", name))] if before else []
        parts.append(f"%json {json.dumps(schema)}")
        parts += [literal(after)] if after else []
        return [f"{rule}: {' '.join(parts)}"]

    return rules
