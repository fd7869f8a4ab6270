"""``response_format`` (OpenAI) and ``structured_outputs`` (vLLM): the two ways to ask for a shape.

OpenAI's ``{"type": "json_object"}`` is any JSON object; ``{"type": "json_schema", "json_schema":
{"name", "schema", "strict", "description"}}`` one that validates against the schema (what the
``openai`` client's ``chat.completions.parse`` sends for a Pydantic model). vLLM's
``structured_outputs`` takes exactly one of ``json`` (a schema, as an object or its JSON text),
``regex``, ``choice`` or ``grammar`` (Lark, or GBNF with ``::=``), plus ``json_object``. Both become
one ``decoding.params.structured.StructuredOutput`` naming the field the client used, so a schema
that does not compile is a 400 naming ``response_format`` or ``structured_outputs``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field

from decoding import ParameterError
from decoding.params.structured import StructuredOutput
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
