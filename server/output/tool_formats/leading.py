"""The stream of formats whose calls are the whole reply (Llama 3's JSON, the pythonic list): a reply
that opens with a call head (after whitespace) is calls; any other reply is plain content.

Until the opening tells (``{``, ``[``, ``<|python_tag|>``...), nothing is released. Then each call is
emitted as soon as its last bracket closes (outside strings, ``Brackets``), so parsing is linear in
the reply however it is split. The first item that is not a call ends the calls: before any call,
the whole reply is content (malformed output stays content); after one, the text from that item on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection

from server.output.tool_formats.calls import Brackets, ToolCall

SKIP, ITEM, END, CONTENT = "skip", "item", "end", "content"  # what a character between calls is


class LeadingCallsStream(ABC):
    """Base of the anchored formats' streams; a subclass says what its reply opens with (``HEADS``),
    what a character between calls means (``between``), when an item is whole and how it parses."""

    HEADS: tuple[str, ...] = ()
    QUOTES = '"'
    TAILS: tuple[str, ...] = ()  # markers dropped right after the calls' end (``<|python_end|>``)

    def __init__(self, names: Collection[str] | None = None) -> None:
        self.names = None if names is None else frozenset(names)
        self._text = ""  # the reply so far, not yet released
        self._mode = "start"  # start -> calls -> (tail ->) plain
        self._pos = 0  # the next character of _text to scan
        self._item: int | None = None  # where the open call began
        self._brackets = Brackets(self.QUOTES)
        self._emitted = 0

    # ---- what a subclass says ----------------------------------------------------------------------------
    @abstractmethod
    def between(self, char: str) -> str:
        """What ``char`` between two calls means: ``SKIP``, ``ITEM`` (a call starts), ``END`` or ``CONTENT``."""

    def item_done(self, char: str) -> bool:
        """After ``char`` was scanned into the open item: is the item whole?"""
        return self._brackets.depth == 0

    @abstractmethod
    def parse(self, item: str) -> ToolCall | None:
        """One whole item as a call of an offered tool, or None (it is not one)."""

    # ---- the stream ----------------------------------------------------------------------------------------
    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        if self._mode == "plain":
            return text, []
        self._text += text
        if self._mode == "start":
            body = self._opening()
            if body is None:
                return "", []
            if body < 0:
                return self._release(0), []
            self._mode, self._pos = "calls", body
        if self._mode == "tail":
            return self._tail(), []
        return self._scan()

    def finish(self, truncated: bool = False) -> tuple[str, list[ToolCall]]:
        if self._mode in ("plain", "calls") and self._item is None:
            return self._release(self._pos) if self._mode == "calls" else "", []
        if self._mode != "calls":  # an undecided opening or a tail marker that never completed
            return self._release(0), []
        if truncated:  # the reply was cut inside a call: neither a call nor content
            self._mode, self._text = "plain", ""
            return "", []
        return self._release(0 if self._emitted == 0 else self._item), []

    def _opening(self) -> int | None:
        """Where the calls begin (after the head), -1 when the reply is plain, None while it cannot tell."""
        stripped = self._text.lstrip()
        for head in self.HEADS:
            if stripped.startswith(head):
                return len(self._text) - len(stripped) + len(head)
        if not stripped or any(head.startswith(stripped) for head in self.HEADS):
            return None
        return -1

    def _scan(self) -> tuple[str, list[ToolCall]]:
        calls: list[ToolCall] = []
        while self._pos < len(self._text):
            char = self._text[self._pos]
            if self._item is None:
                kind = self.between(char)
                if kind == CONTENT:
                    return self._release(0 if self._emitted == 0 else self._pos), calls
                if kind == END:
                    self._mode, self._text = "tail", self._text[self._pos + 1 :]
                    return self._tail(), calls
                if kind == SKIP:
                    self._pos += 1
                    continue
                self._item = self._pos
            self._brackets.step(char)
            self._pos += 1
            if self._brackets.outside_strings and self.item_done(char):
                call = self.parse(self._text[self._item : self._pos])
                if call is None:
                    return self._release(0 if self._emitted == 0 else self._item), calls
                calls.append(call)
                self._emitted += 1
                self._item = None
        return "", calls

    def _tail(self) -> str:
        stripped = self._text.lstrip()
        for tail in self.TAILS:
            if stripped.startswith(tail):
                self._text = stripped[len(tail) :]
                break
            if tail.startswith(stripped):
                return ""
        return self._release(0)

    def _release(self, start: int) -> str:
        """Everything from ``start`` on is content, and so is whatever comes next."""
        content, self._text, self._mode, self._item = self._text[start:], "", "plain", None
        return content
