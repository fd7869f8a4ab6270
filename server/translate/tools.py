"""OpenAI tool calling on the request side: the tool definitions, ``tool_choice``, and the grammar
that makes ``required`` or a named function decode into a valid call.

Every API's tool fields (chat's ``tools``/``tool_choice``/``parallel_tool_calls`` today, the
Responses and Messages APIs' shapes next) become one ``ToolUse``, which the one translation
(``server.translate.params``) reads: the template gets ``template_json()``, the reply's constraint
``grammar()``, the output path the parser.

A call is written in the served model's format (``--tool-call-parser``: Hermes' ``<tool_call>`` JSON,
the convention of the shipped template ``config/chat_templates/hermes_tools.jinja``, or Llama 3's
JSON, pythonic lists, Mistral's ``[TOOL_CALLS]``, GPT-OSS's harmony: ``server.output.tool_formats``).
With ``tool_choice`` "required" or a named function, the reply is constrained to such calls
through the same mechanism as structured outputs: a Lark grammar for llguidance whose JSON part is
the tool's own ``parameters`` schema (``%json``), so even a 135M model returns a call that parses
and whose arguments validate. With "auto" the model decides and ``server.output.tool_parser`` reads
what it wrote; with "none" the tools are neither offered nor parsed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator

from decoding import ParameterError
from decoding.params import check_size
from decoding.params.structured import StructuredOutput
from server.output.tool_formats import DEFAULT_FORMAT, FORMATS, ToolFormat
from server.output.tool_formats.calls import literal
from server.translate.json_call_grammar import json_call_lines
from server.translate.strict import Strict
from server.translate.structured import OpenAIName, closed_objects

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

CUSTOM_TOOLS = ("custom tools (free-form input) are not served: this server's tools are functions whose arguments "
                "are a JSON object; offer a function tool")  # fmt: skip


def functions_only(value: Any) -> Any:  # noqa: ANN401
    """A chat tool, tool call or tool_choice of type ``custom`` is a 400 at its own path."""
    if isinstance(value, dict) and value.get("type") == "custom":
        raise ParameterError(CUSTOM_TOOLS)
    return value


class AllowedTools(Strict):
    """Chat's ``allowed_tools``: which of the offered tools may be called (``mode``: may or must)."""

    mode: Literal["auto", "required"]
    tools: list[Annotated[NamedToolChoice, BeforeValidator(functions_only)]]


class AllowedToolsChoice(Strict):
    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


ChatTool = Annotated[Tool, BeforeValidator(functions_only)]
ChatToolChoice = Annotated[ToolChoice | AllowedToolsChoice, BeforeValidator(functions_only)]


def allowed_subset(tools: list[Tool], names: list[str], param: str = "tool_choice") -> list[Tool]:
    """OpenAI's ``allowed_tools`` choice: the tools it names, the only ones offered to the model (shown by
    the template and callable through the grammar); a name that is not among the tools is a 400."""
    offered = [tool.function.name for tool in tools]
    unknown = [name for name in names if name not in offered]
    if unknown:
        raise ParameterError(f"{param} allows tool '{unknown[0]}', which is not among the tools {offered}", param=param)
    return [tool for tool in tools if tool.function.name in names]


@dataclass(frozen=True)
class ToolUse:
    """The tools a request offers and how it lets the model call them, whatever API it came through."""

    tools: list[Tool]
    choice: ToolChoice | None = None
    parallel: bool = True
    max_calls: int | None = None  # the Responses API's max_tool_calls: the most calls a reply makes (None: any)

    def check(self) -> None:
        """What the schema cannot say: unique names, a choice that needs tools, a named tool that exists,
        a forced call that ``max_calls`` 0 would forbid."""
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
        if self.max_calls == 0 and self.choice not in (None, "auto", "none"):
            raise ParameterError(f"max_tool_calls 0 lets the reply make no call, but tool_choice "
                                 f"{self.describe_choice()} forces one", param="max_tool_calls")  # fmt: skip
        check_size("tool_definitions", json.dumps(self.template_json() or []), "tools")  # what the grammar holds

    def offered(self) -> list[Tool]:
        """The tools the model sees and whose calls are parsed (none with tool_choice "none", or when no
        call may be made: ``max_calls`` 0)."""
        return [] if self.choice == "none" or self.max_calls == 0 else list(self.tools)

    def template_json(self) -> list[dict[str, Any]] | None:
        """The offered tools as chat templates take them (OpenAI's JSON); None when none are offered."""
        return [tool.model_dump(exclude_none=True) for tool in self.offered()] or None

    def grammar(
        self, answer: StructuredOutput | None = None, tool_format: str = DEFAULT_FORMAT
    ) -> StructuredOutput | None:
        """The reply's constraint whenever tools are offered (``call_grammar``); None with "none".
        ``answer``: the request's own constraint (``response_format``), which under "auto" is the
        shape of a reply that calls nothing. With "required" or a named function this reply is calls
        only, so the answer's shape is the next turn's (OpenAI's reading: agents force a tool, then
        ask for the typed answer on the same settings). ``tool_format``: how the served model writes calls."""
        if answer is None or self.choice not in (None, "auto"):
            return call_grammar(self.offered(), self.choice, self.parallel, tool_format=tool_format,
                                max_calls=self.max_calls)  # fmt: skip
        if answer.kind != "json":
            raise ParameterError(f"{answer.param} {answer.kind} cannot be combined with tools; a reply is either "
                                 "a JSON answer or tool calls (use a JSON schema)", param=answer.param)  # fmt: skip
        return call_grammar(self.offered(), self.choice, self.parallel, answer=answer.value, tool_format=tool_format,
                            max_calls=self.max_calls)  # fmt: skip

    def describe_choice(self) -> str:
        return self.choice if isinstance(self.choice, str) else "naming a function"


def call_grammar(
    tools: list[Tool],
    tool_choice: ToolChoice | None,
    parallel: bool,
    answer: dict[str, Any] | None = None,
    tool_format: str = DEFAULT_FORMAT,
    max_calls: int | None = None,
) -> StructuredOutput | None:
    """The grammar of a reply that may call ``tools``, written in ``tool_format``
    (``server.output.tool_formats``: its parser reads back what this grammar lets the model write).

    "required": calls only (several when ``parallel``); a named function: exactly one call of it;
    "auto" (or no choice): the model decides, and a call it opens must be valid: a tagged format's
    free text ends at the format's opener (llguidance's lazy lexeme, as llama.cpp's lazy grammars are
    triggered by it), then calls that name offered tools with arguments valid for their ``parameters``,
    then text again, or nothing more when ``parallel`` is false (at most one call); a ``json_calls``
    format's (hermes) calls also open wherever the model writes JSON naming an offered tool
    (``server.translate.json_call_grammar``); an anchored
    format's (Llama 3 JSON, pythonic) calls can only open the reply, any other reply is plain text.
    With ``strict: true`` a function's objects admit only the properties they name (OpenAI's strict
    mode). ``answer`` (a JSON schema, under "auto"): the reply is either calls or that JSON.
    ``max_calls``: the most calls the reply may make (OpenAI's ``max_tool_calls``: further calls are not
    made); with a list format's calls opened anywhere in free text, they are then one list.
    """
    if not tools or tool_choice == "none" or max_calls == 0:
        return None
    fmt = FORMATS[tool_format]
    if isinstance(tool_choice, NamedToolChoice):
        chosen = [tool for tool in tools if tool.function.name == tool_choice.function.name]
    else:
        chosen = tools
    most = 1 if not parallel or tool_choice not in (None, "auto", "required") else max_calls
    if tool_choice not in (None, "auto"):
        return _with_calls(fmt, chosen, most, ["start: groups"], param="tool_choice")
    if answer is not None:
        lines = ["start: groups | answer", f"answer: %json {json.dumps({'x-guidance': _JSON_STYLE, **answer})}"]
    elif fmt.anchored:
        lines = ["start: groups | PLAIN", f"PLAIN: /{fmt.plain}/"]
    else:  # free text, and a call wherever the model writes the opener
        closer = f" {literal(fmt.closer)}" if fmt.closer else ""
        last = "last_group" if fmt.json_calls and most is not None else "lazy_group"
        lines = [
            _lazy_start(most, fmt.call_per_group, last, "free_tail" if fmt.json_calls else "TEXT"),
            "TEXT: /(.|\\n)*/",
            f"{'tag_group' if fmt.json_calls else 'lazy_group'}: text_then_tag calls{closer}",
            f"text_then_tag[lazy]: TEXT {literal(fmt.opener)}",
        ]
        if fmt.json_calls:  # calls written as JSON outside the tags, held to their schemas as well
            schemas = [json.dumps({"x-guidance": _JSON_STYLE, **_arguments_schema(tool)}) for tool in chosen]
            lines += json_call_lines([tool.function.name for tool in chosen], schemas, one_per_group=most is not None)
    return _with_calls(fmt, chosen, most, lines, param="tools")


def _lazy_start(most: int | None, call_per_group: bool, last: str = "lazy_group", free: str = "TEXT") -> str:
    """Free text with calls opened anywhere in it: any number of groups and ``free`` text after them
    (``most`` None), or at most ``most`` calls, the reply ending with the ``last`` call it may make (after
    it, the opener would start a call the grammar cannot hold). A list format's calls are one group then."""
    if most is None:
        return f"start: lazy_group* {free}"
    if most == 1 or not call_per_group:
        return f"start: {free} | {last}"
    return f"start: lazy_group{{0,{most - 1}}} ({free} | {last})"


def _repeated(item: str, separator: str, most: int | None) -> str:
    """``item`` once, or up to ``most`` times (None: any number) with ``separator`` between."""
    if most == 1:
        return item
    return f"{item} ({separator} {item})" + ("*" if most is None else f"{{0,{most - 1}}}")


def _with_calls(fmt: ToolFormat, tools: list[Tool], most: int | None, lines: list[str], param: str) -> StructuredOutput:
    """``lines`` with the rules they build on: ``groups`` (the reply's calls, each group between the
    format's opener and closer), ``calls`` (a group's) and ``call`` (any of ``tools``, by its own rule),
    ``most`` calls at most (None: any number). A format that tags each call alone writes several as
    several groups, one between each ``separator``; a list format, as one group whose calls the
    ``separator`` parts."""
    group = " ".join([literal(fmt.opener)] * bool(fmt.opener) + ["calls"] + [literal(fmt.closer)] * bool(fmt.closer))
    separator = literal(fmt.separator)
    rules = [
        "groups: " + _repeated("group", separator, most if fmt.call_per_group else 1),
        f"group: {group}",
        "calls: " + _repeated("call", separator, 1 if fmt.call_per_group else most),
        "call: " + " | ".join(f"call_{i}" for i in range(len(tools))),
    ]
    for i, tool in enumerate(tools):
        rules += fmt.call_rules(f"call_{i}", tool.function.name, _arguments_schema(tool), _JSON_STYLE)
    return StructuredOutput("grammar", "\n".join(lines + rules) + "\n", param=param, size_limit="tool_grammar")


def _arguments_schema(tool: Tool) -> dict[str, Any]:
    parameters = tool.function.parameters or {"type": "object", "properties": {}}
    return closed_objects(parameters) if tool.function.strict else parameters
