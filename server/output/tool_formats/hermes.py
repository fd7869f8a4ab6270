"""Hermes (Qwen 2.5/3, Hermes 2/3, the shipped ``hermes_tools.jinja``): ``<tool_call>\\n{"name": ...,
"arguments": {...}}\\n</tool_call>``, any number of times, after optional plain text. Qwen 2.5 (the Coder
models above all) as often writes the same JSON without the tags, fenced (```` ```json ````) or bare, one
object or an array of them: with offered names, those are calls too (``json_calls`` says when), as
llama.cpp's Hermes parser reads them; anything else the model writes is content.

The stream holds back only text that may still become a call (a tag's start, a fence, an object or array
whose head may still name an offered tool), so no tag or call JSON ever leaks into content and prose
streams as it comes; a block that turns out not to be a call is released whole. A call is emitted once its
closing tag, closing fence or last brace is seen. A closing tag or fence inside a JSON string (which a
schema's free-text field allows) does not end the call: an open call is scanned once, character by
character, with its string state kept between deltas.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from server.output.tool_formats.calls import (
    Brackets,
    ModeStream,
    ToolCall,
    ToolFormat,
    before_partial_marker,
    json_call_rules,
    parse_call,
    partial_marker,
)
from server.output.tool_formats.json_calls import (
    FENCE,
    FENCE_LANGUAGES,
    WHITESPACE,
    Head,
    head,
    json_calls,
    unfenced,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_TAG = re.compile(re.escape(OPEN))
_ANY_OPENING = re.compile(f"{re.escape(OPEN)}|{FENCE}|[{{\\[]")
_CODE_END = re.compile(f"{FENCE}|{re.escape(OPEN)}")  # a code block ends at its fence; a tag is a call anywhere


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


def fence_body(text: str) -> int | None:
    """Where the block of a fence (``text`` opens with it) begins: past its language and whitespace; -1
    when the fence is not one a call is written in (a language other than JSON's); None while undecided."""
    pos = len(FENCE)
    while pos < len(text) and (text[pos].isalnum() or text[pos] in "_-"):
        pos += 1
    if pos == len(text):
        return None
    if text[len(FENCE) : pos] not in FENCE_LANGUAGES or text[pos] not in WHITESPACE + "{[":
        return -1
    while pos < len(text) and text[pos] in WHITESPACE:
        pos += 1
    return None if pos == len(text) else pos


class HermesStream(ModeStream):
    """Feed text deltas; get (content to release, calls completed) for each.

    Modes: ``text`` (prose, released up to anything that may open a call), ``tag`` (inside ``<tool_call>``),
    ``fence`` (a fence's opening, undecided), ``fenced`` (a fenced block whose head is a call's, held to
    its closing fence), ``code`` (a fenced block that is no call, released to its closing fence), ``bare``
    (an object or array, undecided), ``object`` (one whose head is a call's, held to its last bracket),
    ``skip`` (one that is no call, released to its last bracket)."""

    def __init__(self, names: Collection[str] | None = None) -> None:
        """``names``: the offered functions (a call naming another stays content); None: any name, and only
        calls in tags (JSON outside them is a call only when it names an offered function)."""
        self.names = None if names is None else frozenset(names)
        self._pending = ""  # text not yet released: a possible opening, or an open call's text
        self._mode = "text"
        self._scan: _CallScan | None = None  # set while a tagged call is open
        self._block = Brackets()  # an object's, array's or fenced block's nesting, as far as _scanned
        self._scanned = 0
        self._body = 0  # where a fenced block's JSON begins in _pending
        self._after_call = False  # the whitespace between calls is the format's, not content
        self._previous = ""  # the last character a skipped block released (a blank line ends it)
        self._last = ""  # the last character released (a backtick before a brace makes it inline code)
        self._in_code = False  # a tag opened inside a code block: the block goes on after it

    # ---- prose ----------------------------------------------------------------------------------------------
    def _text(self) -> tuple[str, list[ToolCall]] | None:
        if self._after_call:
            self._pending = self._pending.lstrip()
            if not self._pending:
                return None
            self._after_call = False
        found = (_TAG if self.names is None else _ANY_OPENING).search(self._pending)
        if found is None:
            content = self._release(len(self._pending) - partial_marker(self._pending, self._markers()))
            return (content, []) if content else None
        content = self._release(found.start())
        if found.group() == OPEN:
            self._pending, self._scan, self._mode = self._pending[len(OPEN) :], _CallScan(), "tag"
        elif found.group() == FENCE:
            self._mode = "fence"
        elif self._last == "`":  # `{...}`: inline code, never a call
            self._mode, self._block, self._previous = "skip", Brackets(), ""
        else:
            self._mode = "bare"
        return content, []

    def _markers(self) -> tuple[str, ...]:
        return (OPEN,) if self.names is None else (OPEN, FENCE)

    def _release(self, end: int) -> str:
        """The pending text up to ``end``, now content."""
        content, self._pending = self._pending[:end], self._pending[end:]
        self._last = content[-1:] or self._last
        return content

    # ---- <tool_call> tags -----------------------------------------------------------------------------------
    def _tag(self) -> tuple[str, list[ToolCall]] | None:
        assert self._scan is not None
        end = self._scan.find_close(self._pending)
        if end < 0:
            return None
        body, self._pending = self._pending[:end], self._pending[end + len(CLOSE) :]
        self._scan, self._mode = None, "code" if self._in_code else "text"
        calls = self._tagged_calls(body)
        if calls is None:
            self._last = ">"
            return OPEN + body + CLOSE, []  # not a call after all: the model's own text
        self._after_call = self._mode == "text"  # inside a code block, what follows is the block's
        return "", calls

    def _tagged_calls(self, body: str) -> list[ToolCall] | None:
        """A tag's calls: its JSON (a missing ``arguments`` is ``{}``, any name when none are offered), or
        several offered calls (an array, objects one after another, a fenced block) in one tag."""
        call = parse_call(body.strip(), self.names)
        if call is not None:
            return [call]
        return None if self.names is None else json_calls(unfenced(body), self.names)

    # ---- fenced blocks --------------------------------------------------------------------------------------
    def _fence(self) -> tuple[str, list[ToolCall]] | None:
        body = fence_body(self._pending)
        if body is None:
            return None
        if body >= 0:
            assert self.names is not None
            verdict = head(self._pending[body:], self.names)
            if verdict in (Head.OPENING, Head.NAMING):
                return None
            if verdict is Head.CALL:
                self._mode, self._body, self._block, self._scanned = "fenced", body, Brackets(), body
                return "", []
        else:
            body = len(FENCE)
        self._mode = "code"
        return self._release(body), []

    def _fenced(self) -> tuple[str, list[ToolCall]] | None:
        text, i = self._pending, self._scanned
        while i < len(text):
            if text[i] == "`" and self._block.outside_strings:
                if text.startswith(FENCE, i):
                    return self._block_done(text[self._body : i], len(FENCE) + i)
                if FENCE.startswith(text[i:]):
                    break
            self._block.step(text[i])
            i += 1
        self._scanned = i
        return None

    def _code(self) -> tuple[str, list[ToolCall]] | None:
        found = _CODE_END.search(self._pending)
        if found is None:
            content = self._release(len(self._pending) - partial_marker(self._pending, (FENCE, OPEN)))
            return (content, []) if content else None
        if found.group() == FENCE:
            self._mode, self._in_code = "text", False
            return self._release(found.end()), []
        content = self._release(found.start())
        self._pending, self._scan, self._mode, self._in_code = self._pending[len(OPEN) :], _CallScan(), "tag", True
        return content, []

    # ---- bare objects and arrays ----------------------------------------------------------------------------
    def _bare(self) -> tuple[str, list[ToolCall]] | None:
        assert self.names is not None
        verdict = head(self._pending, self.names)
        if verdict in (Head.OPENING, Head.NAMING):
            return None
        self._mode = "object" if verdict is Head.CALL else "skip"
        self._block, self._scanned, self._previous = Brackets(), 0, ""
        return "", []

    def _object(self) -> tuple[str, list[ToolCall]] | None:
        text, i = self._pending, self._scanned
        while i < len(text):
            self._block.step(text[i])
            i += 1
            if self._block.depth == 0 and self._block.outside_strings:
                return self._block_done(text[:i], i)
        self._scanned = i
        return None

    def _skip(self) -> tuple[str, list[ToolCall]] | None:
        """Release a bracketed text that is no call up to its last bracket, never looking inside it for
        calls (an unrelated object holding a call-like one is data), and back to prose earlier where it
        cannot be JSON: a line break inside a string, a blank line, a tag or a fence outside strings."""
        text, block = self._pending, self._block
        for i, char in enumerate(text):
            if block.outside_strings and char in "<`":
                rest = text[i:]
                if rest.startswith((OPEN, FENCE)):
                    return self._skipped(i)
                if OPEN.startswith(rest) or FENCE.startswith(rest):
                    return self._skipped(i, done=False)
            if char == "\n" and (not block.outside_strings or self._previous == "\n"):
                return self._skipped(i + 1)
            block.step(char)
            self._previous = char
            if block.depth <= 0 and block.outside_strings:
                return self._skipped(i + 1)
        return self._skipped(len(text), done=False)

    def _skipped(self, end: int, done: bool = True) -> tuple[str, list[ToolCall]] | None:
        content = self._release(end)
        if done:
            self._mode = "text"
        return (content, []) if content or done else None

    def _block_done(self, block: str, end: int) -> tuple[str, list[ToolCall]]:
        """A fenced block or bare value whose head was a call's ends at ``end``: calls when all of it is."""
        assert self.names is not None
        calls = json_calls(block, self.names)
        self._mode = "text"
        if calls is None:
            return self._release(end), []
        self._pending, self._after_call = self._pending[end:], True
        return "", calls

    # ---- the end --------------------------------------------------------------------------------------------
    def finish(self, truncated: bool = False) -> tuple[str, list[ToolCall]]:
        """The stream ended. An unclosed call is a call if its JSON is whole (a reply cut short,
        ``truncated``, inside the closing tag or fence finished the call: it adds nothing); else it is
        dropped when the reply was cut inside it (or inside a name an offered one may complete), or plain
        text when the model ended it so. Anything else held back is content."""
        rest, mode = self._pending, self._mode
        self._pending, self._mode, self._scan = "", "text", None
        if mode == "tag":
            body = before_partial_marker(rest, (CLOSE,)) if truncated else rest
            calls = self._tagged_calls(body)
            if calls is not None:
                return "", calls
            return ("", []) if truncated else (OPEN + rest, [])
        if mode in ("fenced", "object"):
            assert self.names is not None
            calls = json_calls(before_partial_marker(rest[self._body if mode == "fenced" else 0 :], (FENCE,)),
                               self.names)  # fmt: skip
            if calls is not None:
                return "", calls
            return ("", []) if truncated else (rest, [])
        if truncated and mode in ("fence", "bare") and self._naming(rest, mode):
            return "", []
        return rest, []

    def _naming(self, rest: str, mode: str) -> bool:
        """Whether an undecided opening had reached a name that an offered one may complete."""
        assert self.names is not None
        body = 0 if mode == "bare" else fence_body(rest)
        return body is not None and body >= 0 and head(rest[body:], self.names) is Head.NAMING


HERMES = ToolFormat(
    name="hermes",
    stream=HermesStream,
    markers=(OPEN,),
    call_rules=json_call_rules("arguments", before="\n", after="\n"),
    opener=OPEN,
    separator="\n",
    closer=CLOSE,
    call_per_group=True,
    json_calls=True,
)
