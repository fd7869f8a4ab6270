"""``response_format`` (OpenAI) and ``structured_outputs`` (vLLM): the two ways to ask for a shape.

OpenAI's ``{"type": "json_object"}`` is any JSON object; ``{"type": "json_schema", "json_schema":
{"name", "schema", "strict", "description"}}`` one that validates against the schema (what the
``openai`` client's ``chat.completions.parse`` sends for a Pydantic model). vLLM's
``structured_outputs`` takes exactly one of ``json`` (a schema, as an object or its JSON text),
``regex``, ``choice`` or ``grammar`` (Lark, or GBNF with ``::=``), plus ``json_object``. Both become
one ``decoding.params.structured.StructuredOutput`` naming the field the client used, so a schema
that does not compile is a 400 naming ``response_format`` or ``structured_outputs``.

With a reasoning parser (``--reasoning-parser``) a constraint shapes the answer, not the thinking
(``answer_after_thinking``): whatever it is (a schema, a regex, a choice, a grammar, a tool-call
grammar), it is wrapped in one Lark grammar for llguidance whose thinking is free text up to the
end-of-thinking tag, a lazy lexeme as the tool grammars' text before their call tag, and whose
answer is the constraint as it was (``%json``, or a nested ``%lark`` grammar). The engine compiles and
masks it as any grammar, so it holds under every strategy.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import Request
from llguidance.gbnf_to_lark import any_to_lark
from pydantic import Field

from decoding import GenerationParams, ParameterError
from decoding.params.structured import StructuredOutput
from server.output.reasoning import END, START, ReasoningFormat, reasoning_format
from server.translate.strict import Strict

ANY_OBJECT: dict[str, Any] = {"type": "object"}  # json_object: any JSON object, as OpenAI's JSON mode

# OpenAI's rule for a schema's or a function's name (tools and tool_choice share it): a 400 naming the
# field, the pattern and the value, and /openapi.json states it
OPENAI_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
OpenAIName = Annotated[str, Field(pattern=OPENAI_NAME_PATTERN)]


class JsonSchemaFormat(Strict):
    name: OpenAIName
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None  # OpenAI's: objects admit only the properties they name (closed_objects)
    description: str | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(Strict):
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


def structured_output_of(
    response_format: ResponseFormat | None, structured_outputs: StructuredOutputs | None
) -> StructuredOutput | None:
    """The one constraint the body asks for (None: free text); both fields at once is a 400."""
    if response_format is not None and response_format.type != "text" and structured_outputs is not None:
        raise ParameterError("give response_format or structured_outputs, not both", param="structured_outputs")
    if structured_outputs is not None:
        return _from_structured_outputs(structured_outputs)
    if response_format is None or response_format.type == "text":
        if response_format is not None and response_format.json_schema is not None:
            raise ParameterError("response_format.json_schema needs type json_schema", param="response_format")
        return None
    if response_format.type == "json_object":
        return StructuredOutput("json", ANY_OBJECT, param="response_format")
    if response_format.json_schema is None:
        raise ParameterError("response_format of type json_schema needs json_schema", param="response_format")
    schema = response_format.json_schema.schema_
    if schema is not None and response_format.json_schema.strict:
        schema = closed_objects(schema)
    return StructuredOutput("json", ANY_OBJECT if schema is None else schema, param="response_format")


def closed_objects(schema: Any) -> Any:
    """OpenAI's ``strict`` mode: an object admits only the properties it names, unless it says
    otherwise (JSON Schema's own default admits any others, and a small model keeps adding them)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in SUBSCHEMA_MAPS:  # name -> schema
        if isinstance(out.get(key), dict):
            out[key] = {name: closed_objects(sub) for name, sub in out[key].items()}
    for key in SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(sub) for sub in out[key]]
    for key in SUBSCHEMAS:
        if key in out:
            out[key] = closed_objects(out[key])
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SUBSCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains")


def _from_structured_outputs(body: StructuredOutputs) -> StructuredOutput:
    given = {name: value for name, value in (("json", body.json_), ("regex", body.regex), ("choice", body.choice),
             ("grammar", body.grammar)) if value is not None}  # fmt: skip
    if body.json_object:
        if given:
            raise ParameterError("structured_outputs takes exactly one of json, regex, choice, grammar, json_object",
                                 param="structured_outputs")  # fmt: skip
        given["json"] = ANY_OBJECT
    if len(given) != 1:
        raise ParameterError(
            f"structured_outputs takes exactly one of json, regex, choice, grammar, json_object; got "
            f"{', '.join(given) or 'none'}",
            param="structured_outputs",
        )
    kind, value = next(iter(given.items()))
    if kind == "json" and isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ParameterError(f"structured_outputs.json is not valid JSON: {error}",
                                 param="structured_outputs") from error  # fmt: skip
    return StructuredOutput(kind, value, param="structured_outputs")


# ---- the answer after the thinking -------------------------------------------------------------------
# a JSON answer written compactly, as the compiler writes a schema's (free whitespace lets a small model loop)
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def reasoning_of(request: Request) -> ReasoningFormat | None:
    """The server's reasoning format (``--reasoning-parser``; None: replies are not split)."""
    return reasoning_format(request.app.state.settings.reasoning_parser)


def answer_after_thinking(params: GenerationParams, reasoning: ReasoningFormat | None) -> GenerationParams:
    """``params`` whose constraint (if any) holds from the end of the thinking on (``reasoning`` None:
    unchanged); the wrapped grammar keeps the field the client used, for every error about it."""
    spec = params.structured_output
    if reasoning is None or spec is None:
        return params
    wrapped = thinking_then(spec, reasoning)
    wrapped.validate()
    return params.replace(structured_output=wrapped)


def thinking_then(answer: StructuredOutput, reasoning: ReasoningFormat) -> StructuredOutput:
    """The grammar of a reply that thinks freely, then gives ``answer``: inside the thinking from the
    start when the prompt opened it (deepseek_r1), else an optional thinking block first."""
    start = "start: thinking answer" if reasoning.opened_by_prompt else f'start: answer | "{START}" thinking answer'
    # the thinking a lazy lexeme ending at the tag, its text a terminal of its own: as the tool grammars'
    # text before their call tag (a regex written inline in the lazy rule masks ~8x slower)
    lines = [start, "THINK_TEXT: /(.|\\n)*/", f'thinking[lazy]: THINK_TEXT "{END}"', f"answer: {_inline(answer)}"]
    return StructuredOutput("grammar", "\n".join(lines) + "\n", param=answer.param, size_limit=answer.size_limit)


def _inline(spec: StructuredOutput) -> str:
    """``spec`` as one rule's body in llguidance's Lark; a grammar (Lark, or GBNF translated) nested whole."""
    if spec.kind == "json":
        return f"%json {json.dumps({'x-guidance': JSON_STYLE, **spec.value})}"
    if spec.kind == "choice":
        return " | ".join(json.dumps(choice) for choice in spec.value)
    if spec.kind == "regex":
        return f"%lark {{\nstart: /{_lark_regex(spec.value)}/\n}}"
    try:
        inner = any_to_lark(spec.value)
    except Exception as error:  # the GBNF translator raises its own errors: the grammar's fault
        raise ParameterError(f"{spec.param}: {error}", param=spec.param, code="invalid_grammar") from error
    return f"%lark {{\n{inner}\n}}"


def _lark_regex(regex: str) -> str:
    """``regex`` inside Lark's ``/.../``: an unescaped slash escaped, a newline written ``\\n``."""
    out, i = [], 0
    while i < len(regex):
        char = regex[i]
        if char == "\\" and i + 1 < len(regex):
            out.append(regex[i : i + 2])
            i += 2
            continue
        out.append({"/": "\\/", "\n": "\\n"}.get(char, char))
        i += 1
    return "".join(out)
