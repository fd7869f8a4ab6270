"""Fields the SDKs define that ask for what this server does not run: accepted null (or at the value
that asks for nothing), refused otherwise with a 400 naming the field and saying what is not served.

Clients replay the SDKs' own objects (``ResponseFunctionToolCall.model_dump()``, anthropic's
``ToolUseBlock.model_dump()``), which carry every field their type defines, mostly null; a field is
never refused for being there. What these fields ask for, when set: a call made by a program or a
code-execution tool instead of the model itself (``caller``, ``allowed_callers``), a tool namespace or
toolset, a tool loaded later by tool search (``defer_loading``), an asynchronous function. The server
runs none of them (its tools are the client's functions, called by the model, in one flat list), so
a value that asks for one is a 400, where accepting it would answer something the client did not ask.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator

from decoding import ParameterError
from server.translate.strict import Strict

NOT_PROGRAMMATIC = ("this server runs no programs or code execution that call tools: the model makes every call "
                    "itself (a direct call)")  # fmt: skip


def refused_unless_null(what: str, reason: str, kind: Any = str) -> Any:  # noqa: ANN401
    """A field of type ``kind`` accepted null; any value is a 400 saying ``what`` is not served and why."""

    def refuse(value: Any) -> Any:  # noqa: ANN401
        if value is not None:
            raise ParameterError(f"{what} is not served: {reason}")
        return value

    return Annotated[kind | None, BeforeValidator(refuse)]


def refused_when_true(what: str, reason: str) -> Any:  # noqa: ANN401
    """A flag accepted null or false (what this server does anyway); true is a 400 saying why not."""

    def refuse(value: Any) -> Any:  # noqa: ANN401
        if value is True:
            raise ParameterError(f"{what} is not served: {reason}")
        return value

    return Annotated[bool | None, BeforeValidator(refuse)]


class DirectCaller(Strict):
    """``caller: {"type": "direct"}``: the model made the call itself (OpenAI's and Anthropic's spelling)."""

    type: Literal["direct"]


def _direct_caller(value: Any) -> Any:  # noqa: ANN401
    kind = value.get("type") if isinstance(value, dict) else None
    if value is not None and kind != "direct":
        raise ParameterError(f"a call made by a caller of type {json.dumps(kind)} is not served: {NOT_PROGRAMMATIC}")
    return value


def _direct_callers(value: Any) -> Any:  # noqa: ANN401
    others = [caller for caller in value if caller != "direct"] if isinstance(value, list) else []
    if others:
        raise ParameterError(f"allowed_callers {json.dumps(others[0])} is not served: {NOT_PROGRAMMATIC}; "
                             'send ["direct"] or leave it out')  # fmt: skip
    return value


# ``caller``: who made a call being replayed; only the model itself (null: the same)
Caller = Annotated[DirectCaller | None, BeforeValidator(_direct_caller)]
# ``allowed_callers``: who may call a tool; only the model itself (null or ["direct"]: what happens anyway)
AllowedCallers = Annotated[list[Literal["direct"]] | None, BeforeValidator(_direct_callers)]
# a call's or a tool's namespace (OpenAI's namespace tools): this server's tools are one flat list
Namespace = refused_unless_null("a tool namespace", "this server's tools are one flat list of functions; send the "
                                "function at the top level of tools")  # fmt: skip
# a tool_use's or tool_result's toolset (Anthropic's server toolsets, a browser's or a computer's)
Toolset = refused_unless_null("a toolset", "this server runs no server toolsets; offer a custom tool and run it "
                              "yourself")  # fmt: skip
# a tool loaded on demand by tool search
DeferLoading = refused_when_true("defer_loading (a tool loaded by tool search)",
                                 "this server runs no tool search: every tool is offered in the prompt")  # fmt: skip
