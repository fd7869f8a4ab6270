"""Reading tool calls out of generated text (``--tool-call-parser``; vLLM's flag and names).

The Hermes format: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, any number of
times, after optional plain text. A whole reply is parsed into OpenAI's ``message.content`` and
``message.tool_calls``; a stream is parsed as it arrives (``HermesStream``), holding back text that
may be the start of a call so that no tag or call JSON ever leaks into ``delta.content``, and
emitting each call as OpenAI's ``delta.tool_calls`` pieces (its id and name first, then its
arguments) once its closing tag is seen. A call whose JSON does not parse stays plain content.
"""

from __future__ import annotations

import json
import uuid
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


def parse_call(body: str) -> ToolCall | None:
    """One call's JSON (between the tags), or None when it is not a call."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    return ToolCall(call["name"], arguments if isinstance(arguments, str) else json.dumps(arguments))


def parse_hermes(text: str) -> tuple[str | None, list[ToolCall]]:
    """(content before and around the calls, or None when empty; the calls) of a whole reply."""
    return parse_whole(text, HermesStream)


def parse_whole(text: str, parser: type[HermesStream]) -> tuple[str | None, list[ToolCall]]:
    """A whole reply through a stream parser of ``PARSERS``: the same rules, streamed or not."""
    stream = parser()
    content, calls = stream.feed(text)
    more_content, more_calls = stream.finish()
    content = (content + more_content).strip()
    return (content or None), calls + more_calls


class HermesStream:
    """Feed text deltas; get (content to release, calls completed) for each."""

    def __init__(self) -> None:
        self._pending = ""  # text not yet released: a possible tag start, or an open call's body
        self._in_call = False
        self._after_call = False  # the newlines between calls are the format's, not content

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self._pending += text
        content, calls = "", []
        while True:
            if self._in_call:
                end = self._pending.find(CLOSE)
                if end < 0:
                    return content, calls
                body, self._pending = self._pending[:end], self._pending[end + len(CLOSE) :]
                self._in_call = False
                call = parse_call(body.strip())
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
                self._in_call = True
                continue
            keep = _partial_tag(self._pending)
            content += self._pending[: len(self._pending) - keep]
            self._pending = self._pending[len(self._pending) - keep :]
            return content, calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The stream ended: an unclosed call is a call if its JSON is whole, else plain text."""
        rest, self._pending = self._pending, ""
        if not self._in_call:
            return rest, []
        self._in_call = False
        call = parse_call(rest.strip())
        return ("", [call]) if call is not None else (OPEN + rest, [])


def _partial_tag(text: str) -> int:
    """Length of the longest tail of ``text`` that begins ``<tool_call>``."""
    for size in range(min(len(text), len(OPEN) - 1), 0, -1):
        if OPEN.startswith(text[-size:]):
            return size
    return 0


PARSERS = {"hermes": HermesStream}


def check_parser(name: str) -> None:
    if name not in PARSERS:
        raise ValueError(f"--tool-call-parser {name!r} is not known; choose from {', '.join(PARSERS)}")
