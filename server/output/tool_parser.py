"""Reading tool calls out of generated text (``--tool-call-parser``; vLLM's flag and names).

The Hermes format: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, any number of
times, after optional plain text. A whole reply is parsed into OpenAI's ``message.content`` and
``message.tool_calls``; a stream is parsed as it arrives (``HermesStream``), holding back text that
may be the start of a call so that no tag or call JSON ever leaks into ``delta.content``, and
emitting each call as OpenAI's ``delta.tool_calls`` pieces (its id and name first, then its
arguments) once its closing tag is seen.

What counts as a call, as OpenAI's own parser would have it: a JSON object naming one of the offered
functions, with an object for ``arguments``; anything else between the tags stays content. A closing
tag inside a JSON string (which a schema's free-text field allows) does not end the call: an open
call is scanned once, character by character, with its JSON string state kept between deltas, so
parsing is linear in the reply's length however it is split. A reply cut short (``finish(truncated=
True)``, finish reason ``length``) drops its unfinished call: it is neither a call nor content.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def parse_call(body: str, names: Collection[str] | None = None) -> ToolCall | None:
    """One call's JSON (between the tags), or None when it is not a call of an offered function."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    if names is not None and call["name"] not in names:
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):  # some models write OpenAI's string form
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            return None
        return ToolCall(call["name"], arguments) if isinstance(parsed, dict) else None
    return ToolCall(call["name"], json.dumps(arguments)) if isinstance(arguments, dict) else None


class _CallScan:
    """Where the closing tag of an open call is, found once per character: outside JSON strings only."""

    def __init__(self) -> None:
        self.scanned = 0  # characters of the call's text already looked at
        self.in_string = False
        self.escaped = False

    def find_close(self, text: str) -> int:
        """The index of the closing tag in ``text`` (the call so far), or -1 (more text may complete it)."""
        i = self.scanned
        while i < len(text):
            char = text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True
            elif char == "<":
                if text.startswith(CLOSE, i):
                    self.scanned = i
                    return i
                if CLOSE.startswith(text[i:]):  # a tag that may be completed by the next delta
                    self.scanned = i
                    return -1
            i += 1
        self.scanned = i
        return -1


class HermesStream:
    """Feed text deltas; get (content to release, calls completed) for each."""

    def __init__(self, names: Collection[str] | None = None) -> None:
        """``names``: the offered functions (a call naming another stays content); None: any name."""
        self.names = None if names is None else frozenset(names)
        self._pending = ""  # text not yet released: a possible tag start, or an open call's body
        self._scan: _CallScan | None = None  # set while a call is open
        self._after_call = False  # the newlines between calls are the format's, not content

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self._pending += text
        content, calls = "", []
        while True:
            if self._scan is not None:
                end = self._scan.find_close(self._pending)
                if end < 0:
                    return content, calls
                body, self._pending = self._pending[:end], self._pending[end + len(CLOSE) :]
                self._scan = None
                call = parse_call(body.strip(), self.names)
                if call is None:
                    content += OPEN + body + CLOSE  # not a call after all: the model's own text
                else:
                    calls.append(call)
                    self._after_call = True
                continue
            if self._after_call:
                self._pending = self._pending.lstrip()
                if not self._pending:
                    return content, calls
                self._after_call = False
            start = self._pending.find(OPEN)
            if start >= 0:
                content += self._pending[:start]
                self._pending = self._pending[start + len(OPEN) :]
                self._scan = _CallScan()
                continue
            keep = _partial_tag(self._pending)
            content += self._pending[: len(self._pending) - keep]
            self._pending = self._pending[len(self._pending) - keep :]
            return content, calls

    def finish(self, truncated: bool = False) -> tuple[str, list[ToolCall]]:
        """The stream ended. An unclosed call: dropped when the reply was cut short (``truncated``),
        else a call if its JSON is whole, else plain text."""
        rest, self._pending = self._pending, ""
        if self._scan is None:
            return rest, []
        self._scan = None
        if truncated:
            return "", []
        call = parse_call(rest.strip(), self.names)
        return ("", [call]) if call is not None else (OPEN + rest, [])


def _partial_tag(text: str) -> int:
    """Length of the longest tail of ``text`` that begins ``<tool_call>``."""
    for size in range(min(len(text), len(OPEN) - 1), 0, -1):
        if OPEN.startswith(text[-size:]):
            return size
    return 0


ToolStream = HermesStream
ParserFactory = Callable[[], ToolStream]


def parse_hermes(text: str, names: Collection[str] | None = None) -> tuple[str | None, list[ToolCall]]:
    """(content before and around the calls, or None when empty; the calls) of a whole reply."""
    return parse_whole(text, lambda: HermesStream(names))


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


PARSERS: dict[str, Callable[[Collection[str] | None], ToolStream]] = {"hermes": HermesStream}


def check_parser(name: str) -> None:
    if name not in PARSERS:
        raise ValueError(f"--tool-call-parser {name!r} is not known; choose from {', '.join(PARSERS)}")
