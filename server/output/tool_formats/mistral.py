"""Mistral's tool calls (vLLM's ``mistral``): after optional text, ``[TOOL_CALLS]`` then either a JSON
list ``[{"name": ..., "arguments": {...}}, ...]`` (tokenizers before v11) or, in the newer form, one
``name[ARGS]{...}`` per ``[TOOL_CALLS]`` (``name[CALL_ID]id[ARGS]{...}`` read too). The grammar writes
the list form, which every Mistral template reads back."""

from __future__ import annotations

from collections.abc import Collection

from server.output.tool_formats.calls import (
    Brackets,
    ModeStream,
    ToolCall,
    ToolFormat,
    json_call_rules,
    parse_arguments,
    parse_call,
    partial_marker,
)

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
Step = tuple[str, list[ToolCall]] | None  # (content, calls) of one step, or None: more text is needed


class MistralStream(ModeStream):
    """Text until ``[TOOL_CALLS]`` is content; what follows it is a list of calls or a named call."""

    def __init__(self, names: Collection[str] | None = None) -> None:
        self.names = None if names is None else frozenset(names)
        self._pending = ""
        self._mode = "text"  # text -> head -> (list | named -> args) -> text
        self._segment = ""  # the calls' text since the marker (content again if they are not calls)
        self._brackets = Brackets()
        self._item: int | None = None  # in a list: where the open object began, in _pending
        self._function = ""  # the named form's function
        self._scanned = 0  # in list and args modes: characters of _pending already stepped through
        self._emitted = False

    def finish(self, truncated: bool = False) -> tuple[str, list[ToolCall]]:
        rest, mode = self._pending, self._mode
        self._pending, self._mode = "", "text"
        if mode == "text":
            return rest, []
        if truncated:  # cut inside a call: neither a call nor content
            return "", []
        if mode == "args":
            call = parse_arguments(self._function, rest.strip(), self.names)
            if call is not None:
                return "", [call]
        if mode == "list" and self._emitted:
            return rest[self._item :] if self._item is not None else "", []
        return TOOL_CALLS + self._segment + rest, []

    # ---- one step per mode --------------------------------------------------------------------------------
    def _text(self) -> Step:
        start = self._pending.find(TOOL_CALLS)
        if start >= 0:
            content, self._pending = self._pending[:start], self._pending[start + len(TOOL_CALLS) :]
            self._mode, self._segment, self._emitted = "head", "", False
            return content, []
        keep = partial_marker(self._pending, (TOOL_CALLS,))
        cut = len(self._pending) - keep
        content, self._pending = self._pending[:cut], self._pending[cut:]
        return (content, []) if content else None

    def _head(self) -> Step:
        stripped = self._pending.lstrip()
        if not stripped:
            return None
        self._segment += self._pending[: len(self._pending) - len(stripped)]
        if stripped.startswith("["):
            self._segment, self._pending = self._segment + "[", stripped[1:]
            self._mode, self._brackets, self._item, self._scanned = "list", Brackets(), None, 0
        else:
            self._pending, self._mode = stripped, "named"
        return "", []

    def _list(self) -> Step:
        for i in range(self._scanned, len(self._pending)):
            char = self._pending[i]
            if self._item is None:
                if char.isspace() or char == ",":
                    continue
                if char == "]":
                    self._segment, self._pending, self._mode = "", self._pending[i + 1 :], "text"
                    return "", []
                if char != "{":
                    return self._not_calls(i)
                self._item = i
            self._brackets.step(char)
            if self._brackets.outside_strings and self._brackets.depth == 0:
                call = parse_call(self._pending[self._item : i + 1], self.names)
                if call is None:
                    return self._not_calls(self._item)
                self._emitted = True
                self._segment += self._pending[: i + 1]
                self._pending, self._item, self._scanned = self._pending[i + 1 :], None, 0
                return "", [call]
        self._scanned = len(self._pending)
        return None

    def _not_calls(self, at: int) -> Step:
        """The list holds something else: its text from ``at`` (all of it before any call) is content."""
        content = self._pending[at:] if self._emitted else TOOL_CALLS + self._segment + self._pending
        self._pending, self._mode, self._item = "", "text", None
        return content, []

    def _named(self) -> Step:
        end = self._pending.find(ARGS)
        if end < 0:
            return None
        self._function = self._pending[:end].split(CALL_ID)[0].strip()
        self._segment += self._pending[: end + len(ARGS)]
        self._pending, self._mode, self._brackets = self._pending[end + len(ARGS) :], "args", Brackets()
        self._scanned = 0
        return "", []

    def _args(self) -> Step:
        for i in range(self._scanned, len(self._pending)):
            char = self._pending[i]
            self._brackets.step(char)
            if self._brackets.outside_strings and self._brackets.depth == 0 and not char.isspace():
                body, self._pending, self._mode = self._pending[: i + 1], self._pending[i + 1 :], "text"
                call = parse_arguments(self._function, body, self.names)
                return (TOOL_CALLS + self._segment + body, []) if call is None else ("", [call])
        self._scanned = len(self._pending)
        return None


MISTRAL = ToolFormat(
    name="mistral",
    stream=MistralStream,
    markers=(TOOL_CALLS,),
    call_rules=json_call_rules("arguments"),
    opener=TOOL_CALLS + "[",
    separator=", ",
    closer="]",
)
