"""GPT-OSS's harmony format (vLLM's ``openai`` tool parser): the reply is messages, each
``<|channel|>NAME [to=functions.F] [<|constrain|>json]<|message|>BODY`` ended by ``<|end|>``,
``<|return|>`` or, for a call, ``<|call|>``; the next opens with ``<|start|>assistant``. A message
addressed ``to=functions.F`` (in its channel or its role part) is a call whose body is the arguments'
JSON; every other message's body is content, its markers dropped (the ``analysis`` channel included:
splitting reasoning out is a reasoning parser's job). ``<|call|>`` is GPT-OSS's stop token, so a call
may end the reply without it. Text outside any message (a model that does not speak harmony) is content.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from server.output.tool_formats.calls import (
    ModeStream,
    ToolCall,
    ToolFormat,
    before_partial_marker,
    json_call_rules,
    parse_arguments,
    partial_marker,
)

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")
Step = tuple[str, list[ToolCall]] | None  # (content, calls) of one step, or None: more text is needed


class HarmonyStream(ModeStream):
    def __init__(self, names: Collection[str] | None = None) -> None:
        self.names = None if names is None else frozenset(names)
        self._pending = ""
        self._mode = "outside"  # outside -> heading -> (body | call) -> outside
        self._header = ""
        self._function = ""

    def finish(self, truncated: bool = False) -> tuple[str, list[ToolCall]]:
        rest, mode = self._pending, self._mode
        self._pending, self._mode = "", "outside"
        if mode in ("outside", "body"):
            return rest, []
        if mode == "call":  # a call whose JSON is whole is finished, even cut inside its end marker
            body = before_partial_marker(rest, (CALL, END)) if truncated else rest
            call = parse_arguments(self._function, body.strip(), self.names)
            if call is not None:
                return "", [call]
        if truncated:  # cut inside a header or a call: neither a call nor content
            return "", []
        return self._header + rest, []

    def _outside(self) -> Step:
        return self._until((START, CHANNEL), "heading")

    def _body(self) -> Step:
        return self._until((END, RETURN, CALL, START), "outside")

    def _until(self, markers: tuple[str, ...], then: str) -> Step:
        """Content up to the first of ``markers``; then the mode ``then`` (a header after ``<|start|>``)."""
        found = [(at, marker) for marker in markers if (at := self._pending.find(marker)) >= 0]
        if found:
            at, marker = min(found)
            content, self._pending = self._pending[:at], self._pending[at + len(marker) :]
            self._mode = "heading" if marker in (START, CHANNEL) else then
            self._header = marker
            return content, []
        cut = len(self._pending) - partial_marker(self._pending, markers)
        content, self._pending = self._pending[:cut], self._pending[cut:]
        return (content, []) if content else None

    def _heading(self) -> Step:
        at = self._pending.find(MESSAGE)
        if at < 0:
            return None
        self._header += self._pending[: at + len(MESSAGE)]
        self._pending = self._pending[at + len(MESSAGE) :]
        recipient = RECIPIENT.search(self._header)
        self._mode, self._function = ("call", recipient.group(1)) if recipient else ("body", "")
        return "", []

    def _call(self) -> Step:
        found = [at for marker in (CALL, END) if (at := self._pending.find(marker)) >= 0]
        if not found:
            return None
        at = min(found)
        marker = CALL if self._pending.startswith(CALL, at) else END
        body, self._pending = self._pending[:at], self._pending[at + len(marker) :]
        self._mode = "outside"
        call = parse_arguments(self._function, body.strip(), self.names)
        return (self._header + body + marker, []) if call is None else ("", [call])


HARMONY = ToolFormat(
    name="openai",
    stream=HarmonyStream,
    markers=(CALL, "to=functions."),
    call_rules=json_call_rules(None, before="{name} <|constrain|>json" + MESSAGE),
    opener=CHANNEL + "commentary to=functions.",
    separator=START + "assistant",
    closer=CALL,
    call_per_group=True,
)
