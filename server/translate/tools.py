"""OpenAI tool calling on the request side: the tool definitions, ``tool_choice``, and the grammar
that makes ``required`` or a named function decode into a valid call.

Every API's tool fields (chat's ``tools``/``tool_choice``/``parallel_tool_calls`` today, the
Responses and Messages APIs' shapes next) become one ``ToolUse``, which the one translation
(``server.translate.params``) reads: the template gets ``template_json()``, the reply's constraint
``grammar()``, the output path the parser.

A call is written the Hermes way (``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
the convention of the shipped template ``config/chat_templates/hermes_tools.jinja`` and of most open
models). With ``tool_choice`` "required" or a named function, the reply is constrained to such calls
through the same mechanism as structured outputs: a Lark grammar for llguidance whose JSON part is
the tool's own ``parameters`` schema (``%json``), so even a 135M model returns a call that parses
and whose arguments validate. With "auto" the model decides and ``server.output.tool_parser`` reads
what it wrote; with "none" the tools are neither offered nor parsed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from decoding import ParameterError
from decoding.params.structured import StructuredOutput
from server.translate.strict import Strict

# the call's JSON written compactly, as the template shows it: free whitespace lets a small model loop
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class FunctionDefinition(Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


@dataclass(frozen=True)
class ToolUse:
    """The tools a request offers and how it lets the model call them, whatever API it came through."""

    tools: list[Tool]
    choice: ToolChoice | None = None
    parallel: bool = True

    def check(self) -> None:
        """What the schema cannot say: unique names, a choice that needs tools, a named tool that exists."""
        names = [tool.function.name for tool in self.tools]
        if len(set(names)) != len(names):
            raise ParameterError(f"tools: function names must be unique, got {names}", param="tools")
        if not all(names):
            raise ParameterError("tools: every function needs a non-empty name", param="tools")
        if self.choice is not None and self.choice != "none" and not names:
            raise ParameterError("tool_choice needs tools", param="tool_choice")
        if isinstance(self.choice, NamedToolChoice) and self.choice.function.name not in names:
            raise ParameterError(
                f"tool_choice names function '{self.choice.function.name}', which is not among the tools {names}",
                param="tool_choice",
            )

    def offered(self) -> list[Tool]:
        """The tools the model sees and whose calls are parsed (none with tool_choice "none")."""
        return [] if self.choice == "none" else list(self.tools)

    def template_json(self) -> list[dict[str, Any]] | None:
        """The offered tools as chat templates take them (OpenAI's JSON); None when none are offered."""
        return [tool.model_dump(exclude_none=True) for tool in self.offered()] or None

    def grammar(self) -> StructuredOutput | None:
        """The reply's constraint: calls only for "required" or a named function; None under "auto"."""
        return call_grammar(self.offered(), self.choice, self.parallel)

    def describe_choice(self) -> str:
        return self.choice if isinstance(self.choice, str) else "naming a function"


def call_grammar(tools: list[Tool], tool_choice: ToolChoice | None, parallel: bool) -> StructuredOutput | None:
    """The constraint for "required" (any tool; several calls when ``parallel``) or a named function."""
    if isinstance(tool_choice, NamedToolChoice):
        chosen = [tool for tool in tools if tool.function.name == tool_choice.function.name]
    elif tool_choice == "required":
        chosen = tools
    else:
        return None
    alternatives = " | ".join(f"call_{i}" for i in range(len(chosen)))
    repeat = ' ("\\n" call)*' if parallel and tool_choice == "required" else ""
    lines = [f"start: call{repeat}", f"call: {alternatives}"]
    for i, tool in enumerate(chosen):
        lines.append(f'call_{i}: "<tool_call>\\n" %json {json.dumps(_call_schema(tool))} "\\n</tool_call>"')
    return StructuredOutput("grammar", "\n".join(lines) + "\n", param="tool_choice")


def _call_schema(tool: Tool) -> dict[str, Any]:
    parameters = tool.function.parameters or {"type": "object", "properties": {}}
    return {
        "x-guidance": _JSON_STYLE,
        "type": "object",
        "properties": {"name": {"const": tool.function.name}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
