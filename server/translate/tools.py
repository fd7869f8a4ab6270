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
from decoding.params import check_size
from decoding.params.structured import StructuredOutput
from server.translate.strict import Strict
from server.translate.structured import OpenAIName, closed_objects

OPEN, CLOSE = "<tool_call>", "</tool_call>"  # the Hermes call tags (server.output.tool_parser reads them)

# the call's JSON written compactly, as the template shows it: free whitespace lets a small model loop
_JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class FunctionDefinition(Strict):
    name: OpenAIName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(Strict):
    name: OpenAIName


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
        check_size("tool_definitions", json.dumps(self.template_json() or []), "tools")  # what the grammar holds

    def offered(self) -> list[Tool]:
        """The tools the model sees and whose calls are parsed (none with tool_choice "none")."""
        return [] if self.choice == "none" else list(self.tools)

    def template_json(self) -> list[dict[str, Any]] | None:
        """The offered tools as chat templates take them (OpenAI's JSON); None when none are offered."""
        return [tool.model_dump(exclude_none=True) for tool in self.offered()] or None

    def grammar(self, answer: StructuredOutput | None = None) -> StructuredOutput | None:
        """The reply's constraint whenever tools are offered (``call_grammar``); None with "none".
        ``answer``: the request's own constraint (``response_format``), which under "auto" is the
        shape of a reply that calls nothing. With "required" or a named function this reply is calls
        only, so the answer's shape is the next turn's (OpenAI's reading: agents force a tool, then
        ask for the typed answer on the same settings)."""
        if answer is None or self.choice not in (None, "auto"):
            return call_grammar(self.offered(), self.choice, self.parallel)
        if answer.kind != "json":
            raise ParameterError(f"{answer.param} {answer.kind} cannot be combined with tools; a reply is either "
                                 "a JSON answer or tool calls (use a JSON schema)", param=answer.param)  # fmt: skip
        return call_grammar(self.offered(), self.choice, self.parallel, answer=answer.value)

    def describe_choice(self) -> str:
        return self.choice if isinstance(self.choice, str) else "naming a function"


def call_grammar(
    tools: list[Tool], tool_choice: ToolChoice | None, parallel: bool, answer: dict[str, Any] | None = None
) -> StructuredOutput | None:
    """The grammar of a reply that may call ``tools``.

    "required": calls only (several when ``parallel``); a named function: exactly one call of it;
    "auto" (or no choice): free text until the model writes the call tag, then a call that names an
    offered tool with arguments valid for its ``parameters`` (llguidance's lazy lexeme: the text
    lexeme ends at the first ``<tool_call>``, as llama.cpp's lazy grammars are triggered by it),
    then text again, or nothing more when ``parallel`` is false (at most one call). With
    ``strict: true`` a function's objects admit only the properties they name (OpenAI's strict mode).
    ``answer`` (a JSON schema, under "auto"): the reply is either calls (the tag first) or that JSON.
    """
    if not tools or tool_choice == "none":
        return None
    if isinstance(tool_choice, NamedToolChoice):
        chosen = [tool for tool in tools if tool.function.name == tool_choice.function.name]
    else:
        chosen = tools
    if tool_choice in (None, "auto"):
        return _auto_grammar(chosen, parallel) if answer is None else _calls_or_answer(chosen, parallel, answer)
    alternatives = " | ".join(f"call_{i}" for i in range(len(chosen)))
    repeat = ' ("\\n" call)*' if parallel and tool_choice == "required" else ""
    lines = [f"start: call{repeat}", f"call: {alternatives}"]
    for i, tool in enumerate(chosen):
        lines.append(f'call_{i}: "{OPEN}\\n" %json {json.dumps(_call_schema(tool))} "\\n{CLOSE}"')
    return StructuredOutput("grammar", "\n".join(lines) + "\n", param="tool_choice", size_limit="tool_grammar")


def _auto_grammar(tools: list[Tool], parallel: bool) -> StructuredOutput:
    return _with_arguments(tools, [
        "start: call* TEXT" if parallel else "start: TEXT | call",
        "TEXT: /(.|\\n)*/",
        f'call: text_then_tag "\\n" arguments "\\n{CLOSE}"',
        f'text_then_tag[lazy]: TEXT "{OPEN}"',
    ])  # fmt: skip


def _calls_or_answer(tools: list[Tool], parallel: bool, answer: dict[str, Any]) -> StructuredOutput:
    return _with_arguments(tools, [
        "start: calls | answer",
        'calls: call ("\\n" call)*' if parallel else "calls: call",
        f'call: "{OPEN}\\n" arguments "\\n{CLOSE}"',
        f"answer: %json {json.dumps({'x-guidance': _JSON_STYLE, **answer})}",
    ])  # fmt: skip


def _with_arguments(tools: list[Tool], lines: list[str]) -> StructuredOutput:
    """``lines`` (whose ``arguments`` is any offered tool's call JSON) with the rules that define it."""
    rules = ["arguments: " + " | ".join(f"arguments_{i}" for i in range(len(tools)))]
    rules += [f"arguments_{i}: %json {json.dumps(_call_schema(tool))}" for i, tool in enumerate(tools)]
    return StructuredOutput("grammar", "\n".join(lines + rules) + "\n", param="tools", size_limit="tool_grammar")


def _call_schema(tool: Tool) -> dict[str, Any]:
    parameters = tool.function.parameters or {"type": "object", "properties": {}}
    if tool.function.strict:
        parameters = closed_objects(parameters)
    return {
        "x-guidance": _JSON_STYLE,
        "type": "object",
        "properties": {"name": {"const": tool.function.name}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
