"""Hermes (Qwen 2.5/3, Hermes 2/3, the shipped ``hermes_tools.jinja``): ``<tool_call>\\n{"name": ...,
"arguments": {...}}\\n</tool_call>``, any number of times, after optional plain text.

The stream holds back text that may be the start of a tag, so that no tag or call JSON ever leaks
into content, and emits each call once its closing tag is seen. A closing tag inside a JSON string
(which a schema's free-text field allows) does not end the call: an open call is scanned once,
character by character, with its string state kept between deltas.
"""

from __future__ import annotations

from collections.abc import Collection

from server.output.tool_formats.calls import (
    Brackets,
    ToolCall,
    ToolFormat,
    before_partial_marker,
    json_call_rules,
    parse_call,
    partial_marker,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class _CallScan:
    """Where the closing tag of an open call is, found once per character: outside JSON strings only."""

    def __init__(self) -> None:
        self.scanned = 0  # characters of the call's text already looked at
        self.brackets = Brackets()

    def find_close(self, text: str) -> int:
        """The index of the closing tag in ``text`` (the call so far), or -1 (more text may complete it)."""
        i = self.scanned
        while i < len(text):
            if text[i] == "<" and self.brackets.outside_strings:
                if text.startswith(CLOSE, i):
                    self.scanned = i
                    return i
                if CLOSE.startswith(text[i:]):  # a tag that may be completed by the next delta
                    self.scanned = i
                    return -1
            self.brackets.step(text[i])
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
            keep = partial_marker(self._pending, (OPEN,))
            content += self._pending[: len(self._pending) - keep]
            self._pending = self._pending[len(self._pending) - keep :]
            return content, calls

    def finish(self, truncated: bool = False) -> tuple[str, list[ToolCall]]:
        """The stream ended. An unclosed call is a call if its JSON is whole (a reply cut short,
        ``truncated``, inside the closing tag finished the call: the tag adds nothing); else it is
        dropped when the reply was cut inside it, or plain text when the model ended it so."""
        rest, self._pending = self._pending, ""
        if self._scan is None:
            return rest, []
        self._scan = None
        body = before_partial_marker(rest, (CLOSE,)) if truncated else rest
        call = parse_call(body.strip(), self.names)
        if call is not None:
            return "", [call]
        return ("", []) if truncated else (OPEN + rest, [])


HERMES = ToolFormat(
    name="hermes",
    stream=HermesStream,
    markers=(OPEN,),
    call_rules=json_call_rules("arguments", before="\n", after="\n"),
    opener=OPEN,
    separator="\n",
    closer=CLOSE,
    call_per_group=True,
)
