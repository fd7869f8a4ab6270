"""Bodies built from the installed SDKs' own types: every field a client library can send, null and set.

A record is a request param ``TypedDict`` (``openai.types...Param``, ``anthropic.types...Param``) or
a response model a client replays (``ResponseFunctionToolCall``, anthropic's ``ToolUseBlock``): its
fields, which are required (``Required[...]``, or a pydantic field without a default) and what each
may hold come from ``typing.get_type_hints``. ``walk`` sends one record: its minimal value (required
fields only), then each optional field null, then each field (required or not) set to each of its
plausible values (every literal, every branch of a union, a record's own minimal value), then the
same for the records nested in it, each record type walked once per walk.
"""

from __future__ import annotations

import collections.abc
import json
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pydantic
import typing_extensions

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
# values a field of this name must hold to make sense to any server (a JSON object's text, a schema)
BY_NAME: dict[str, Any] = {
    "name": "get_weather",
    "arguments": json.dumps({"city": "Paris"}),
    "parameters": SCHEMA,
    "input_schema": SCHEMA,
    "output_schema": SCHEMA,
    "schema": SCHEMA,
    "logit_bias": {"1": 1},  # token ids, not any object's keys
}
# a field whose type says only "objects" where the API says which (the tools an allowed_tools choice names)
BY_FIELD: dict[tuple[str, str], Any] = {
    ("ToolChoiceAllowedParam", "tools"): [{"type": "function", "name": "get_weather"}],
    ("ChatCompletionAllowedToolsParam", "tools"): [{"type": "function", "function": {"name": "get_weather"}}],
}
WRAPPERS = {typing.Required, typing.NotRequired, typing_extensions.Required, typing_extensions.NotRequired,
            typing_extensions.ReadOnly}  # fmt: skip
LISTS = {list, collections.abc.Iterable, collections.abc.Sequence}  # what get_origin gives for List, Iterable...


def _is_list(origin: Any) -> bool:  # noqa: ANN401
    """A list type (openai's ``SequenceNotStr[str]`` among them)."""
    return origin in LISTS or getattr(origin, "__name__", "") == "SequenceNotStr"


@dataclass(frozen=True)
class Field:
    name: str  # as sent (a pydantic field's alias)
    hint: Any
    required: bool


def _unwrap(hint: Any) -> Any:  # noqa: ANN401
    """``hint`` without ``Required``/``NotRequired``/``Annotated`` around it."""
    while True:
        origin = typing_extensions.get_origin(hint)
        if origin in WRAPPERS or origin is typing_extensions.Annotated:
            hint = typing_extensions.get_args(hint)[0]
        else:
            return hint


def branches(hint: Any) -> list[Any]:  # noqa: ANN401
    """A union's non-null members, flattened (one member for a plain type)."""
    hint = _unwrap(hint)
    if typing_extensions.get_origin(hint) in (typing.Union, types.UnionType):
        return [b for arg in typing_extensions.get_args(hint) for b in branches(arg)]
    return [] if hint is type(None) else [hint]


def is_record(hint: Any) -> bool:  # noqa: ANN401
    if not isinstance(hint, type):
        return False
    return typing_extensions.is_typeddict(hint) or issubclass(hint, pydantic.BaseModel)


def fields(record: type) -> list[Field]:
    """A record's fields as a client sends them."""
    if issubclass(record, pydantic.BaseModel):
        return [Field(info.alias or name, info.annotation, info.is_required()) for name, info in
                record.model_fields.items()]  # fmt: skip
    hints = typing_extensions.get_type_hints(record, include_extras=True)
    out = []
    for name, hint in hints.items():
        origin = typing_extensions.get_origin(hint)
        optional = origin in (typing.NotRequired, typing_extensions.NotRequired)
        required = origin in (typing.Required, typing_extensions.Required) or (record.__total__ and not optional)
        out.append(Field(name, hint, required))
    return out


def values(hint: Any, name: str = "", record: type | None = None) -> list[Any]:  # noqa: ANN401
    """Plausible values of a field, the first the simplest: one per literal and per union branch."""
    if record is not None and (record.__name__, name) in BY_FIELD:
        return [BY_FIELD[record.__name__, name]]
    if name in BY_NAME:
        return [BY_NAME[name]]
    out: list[Any] = []
    for branch in branches(hint):
        origin = typing_extensions.get_origin(branch)
        if origin is typing.Literal:
            out += list(typing_extensions.get_args(branch))
        elif is_record(branch):
            out.append(minimal(branch))
        elif _is_list(origin) or branch is list:
            args = typing_extensions.get_args(branch)
            out += [[item] for item in values(args[0])] if args else [[]]
        elif origin in (dict, collections.abc.Mapping) or branch is dict:
            out.append({"city": "Paris"})
        elif branch is bool:
            out += [True, False]
        elif branch is int:
            out.append(1)
        elif branch is float:
            out.append(0.5)
        elif branch in (str, object) or branch is Any:
            out.append("hello")
    unique: list[Any] = []
    for value in out:
        if value not in unique:
            unique.append(value)
    return unique


def minimal(record: type) -> dict[str, Any]:
    """The record with its required fields only, each its simplest value."""
    return {field.name: values(field.hint, field.name, record)[0] for field in fields(record) if field.required}


@dataclass(frozen=True)
class Variant:
    record: type  # the record whose field is varied
    path: str  # where the varied field sits in the body (the record's own path for its minimal value)
    value: Any  # the value at the walk's root path
    note: str  # what was varied, for failure messages

    @property
    def whole(self) -> bool:
        """Whether this is the record's minimal value (a refusal of it refuses the record's type)."""
        return self.note.endswith(" minimal")


Send = Callable[[Variant], bool]  # sends a variant; True: the record's type is refused as a whole


def walk(record: type, path: str, send: Send, seen: set[type] | None = None) -> None:
    """Send the record's minimal value at ``path``; unless refused as a whole, each field null (optional
    ones) and set to each of its plausible values, then the records nested in each field, walked the
    same way. Each record type is walked once per walk."""
    seen = seen if seen is not None else set()
    seen.add(record)
    base = minimal(record)
    if send(Variant(record, path, base, f"{record.__name__} minimal")):
        return
    for field in fields(record):
        where = f"{path}.{field.name}" if path else field.name  # "": the record is the body
        if not field.required:
            send(Variant(record, where, {**base, field.name: None}, f"{record.__name__}.{field.name}=null"))
        for value in values(field.hint, field.name, record):
            send(Variant(record, where, {**base, field.name: value}, f"{record.__name__}.{field.name}={value!r}"))
        if field.name in BY_NAME or (record.__name__, field.name) in BY_FIELD:
            continue
        for nested, in_list in _nested_records(field.hint):
            if nested in seen:
                continue
            inner = f"{where}[0]" if in_list else where

            def inside(variant: Variant, name: str = field.name, in_list: bool = in_list) -> bool:
                value = [variant.value] if in_list else variant.value
                return send(Variant(variant.record, variant.path, {**base, name: value}, variant.note))

            walk(nested, inner, inside, seen)


def _nested_records(hint: Any) -> list[tuple[type, bool]]:  # noqa: ANN401
    """(record, whether it sits in a list) for every record a field may hold."""
    out = []
    for branch in branches(hint):
        if is_record(branch):
            out.append((branch, False))
        elif _is_list(typing_extensions.get_origin(branch)):
            out += [(item, True) for item in branches(typing_extensions.get_args(branch)[0]) if is_record(item)]
    return out
