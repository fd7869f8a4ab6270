"""Llama 3.1-3.3's JSON tool calls (vLLM's ``llama3_json``): the reply is ``{"name": ..., "parameters":
{...}}``, possibly after ``<|python_tag|>``, several separated by ``;``. A reply that does not open
with one is plain content (Llama's own rule: a call is the whole turn)."""

from __future__ import annotations

from server.output.tool_formats.calls import ToolCall, ToolFormat, json_call_rules, parse_call
from server.output.tool_formats.leading import CONTENT, ITEM, SKIP, LeadingCallsStream

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonStream(LeadingCallsStream):
    HEADS = (PYTHON_TAG, "{")

    def _opening(self) -> int | None:
        start = super()._opening()
        if start is not None and start > 0 and self._text[start - 1] == "{":
            return start - 1  # the brace opens the first call
        return start

    def between(self, char: str) -> str:
        if char.isspace() or char in ";,":
            return SKIP
        return ITEM if char == "{" else CONTENT

    def parse(self, item: str) -> ToolCall | None:
        return parse_call(item, self.names)


LLAMA3_JSON = ToolFormat(
    name="llama3_json",
    stream=Llama3JsonStream,
    markers=(PYTHON_TAG,),
    call_rules=json_call_rules("parameters"),
    separator="; ",
    anchored=True,
    plain=r"(([^{<\s]|<[^|])(.|\n)*)?",  # a reply that opens with neither a call nor a special marker
)
