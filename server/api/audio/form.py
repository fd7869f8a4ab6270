"""An audio request's multipart form: its one file, bounded, and its other fields as the values a JSON body holds.

Form values are strings. A value is read as JSON where it is JSON of a kind its field takes (a number, true or
false, a list, an object), else kept as the string sent: ``num_beams=5`` is a number, ``prompt=123`` stays text,
``temperature=[0,0.2,0.4]`` is a list. Lists arrive as the openai client sends them (``include[]=logprobs``, the
key repeated), as a repeated field, or as one JSON list; objects as its bracketed keys
(``chunking_strategy[type]=server_vad``) or as one JSON object. A list of lists (``bad_words_ids``) is one JSON
value: the bracketed form cannot say where an inner list ends.
"""

from __future__ import annotations

import json
import types
import typing
from typing import Any

from fastapi import Request
from pydantic import BaseModel
from starlette.datastructures import UploadFile

from server.http.errors import APIError
from server.http.limits import RequestTooLarge, UploadLimit

FILE_FIELD = "file"
MAX_FORM_FIELDS = 200  # more names than every knob and OpenAI field together


async def read_form(request: Request, body: type[BaseModel], limit: UploadLimit) -> tuple[dict[str, Any], bytes]:
    """(the form's fields as ``body`` reads them, the file's bytes); the file missing, empty or over its
    limit is a 400 or 413 naming ``file``."""
    try:
        form = await request.form(max_files=1, max_fields=MAX_FORM_FIELDS)
        pairs: list[tuple[str, str]] = []
        audio: bytes | None = None
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                if key != FILE_FIELD:
                    raise APIError(400, f"{key}: only '{FILE_FIELD}' takes a file upload", param=key,
                                   code="invalid_value")  # fmt: skip
                if limit.max_bytes and value.size is not None and value.size > limit.max_bytes:
                    raise limit.refused(value.size)
                audio = await value.read()
            elif key == FILE_FIELD:
                raise APIError(400, "file must be an uploaded file (multipart/form-data), not a text field",
                               param=FILE_FIELD, code="invalid_value")  # fmt: skip
            else:
                pairs.append((key, value))
    except RequestTooLarge:
        raise limit.refused() from None
    if audio is None:
        raise APIError(400, "missing required field: file (the audio, sent as multipart/form-data)",
                       param=FILE_FIELD, code="missing_field")  # fmt: skip
    if limit.max_bytes and len(audio) > limit.max_bytes:
        raise limit.refused(len(audio))
    if not audio:
        raise APIError(400, "file is empty: send the audio's bytes", param=FILE_FIELD, code="empty_file")
    return form_fields(pairs, body), audio


def form_fields(pairs: list[tuple[str, str]], body: type[BaseModel]) -> dict[str, Any]:
    """The form's text fields as ``body``'s values (see the module's docstring)."""
    grouped: dict[str, list[tuple[str | None, str]]] = {}  # name -> (key inside an object or None, raw value)
    bracketed: set[str] = set()  # sent as ``name[]``: a list, even of one item
    for key, raw in pairs:
        name, inner = _split_key(key)
        grouped.setdefault(name, []).append((inner, raw))
        if key.endswith("[]"):
            bracketed.add(name)
    fields: dict[str, Any] = {}
    for name, entries in grouped.items():
        annotation = body.model_fields[name].annotation if name in body.model_fields else None
        if any(inner is not None for inner, _ in entries):
            fields[name] = {inner: _coerced(raw, None) for inner, raw in entries if inner is not None}
            continue
        values = [_coerced(raw, annotation) for _, raw in entries]
        only_lists = _kinds(annotation) == {list}  # include, timestamp_granularities: one item is a list of one
        if len(values) > 1 or name in bracketed or (only_lists and not isinstance(values[0], list)):
            fields[name] = values
        else:
            fields[name] = values[0]
    return fields


def _split_key(key: str) -> tuple[str, str | None]:
    """``include[]`` -> (include, None); ``chunking_strategy[type]`` -> (chunking_strategy, type); anything
    deeper is a 400 naming the field."""
    if "[" not in key:
        return key, None
    name, _, rest = key.partition("[")
    if rest == "]":
        return name, None
    inner, _, tail = rest.partition("]")
    if not inner or tail:
        raise APIError(400, f"{name}: a nested value ({key}) is sent as one JSON value, e.g. {name}=[[1, 2]]",
                       param=name, code="invalid_value")  # fmt: skip
    return name, inner


def _coerced(raw: str, annotation: Any) -> Any:  # noqa: ANN401
    """``raw`` as JSON where it parses to a kind ``annotation`` takes (any kind for an unknown field), else ``raw``."""
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    if isinstance(value, str) or value is None:  # a quoted string or null: the text as sent
        return raw
    kinds = _kinds(annotation)
    if annotation is None or any(isinstance(value, kind) for kind in kinds):
        return value
    if list in kinds:  # a list field sent one item at a time: the item's own kinds decide
        items = _item_kinds(annotation)
        if any(isinstance(value, kind) for kind in items) and not isinstance(value, (list, dict)):
            return value
    return raw


def _kinds(annotation: Any) -> set[type]:  # noqa: ANN401
    """The JSON kinds a field's type takes."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        args = typing.get_args(annotation)
        return set().union(*(_kinds(arg) for arg in (args[:1] if origin is typing.Annotated else args)))
    if origin is typing.Literal:
        return {type(arg) for arg in typing.get_args(annotation)}
    if origin in (list, tuple):
        return {list}
    if origin is dict or (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return {dict}
    if annotation is float:
        return {float, int}
    if annotation is int:
        return {int}
    if annotation is bool:
        return {bool}
    return {str} if annotation is str else set()


def _item_kinds(annotation: Any) -> set[type]:  # noqa: ANN401
    """The kinds a list field's items take."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_item_kinds(arg) for arg in typing.get_args(annotation)))
    if origin in (list, tuple):
        return set().union(*(_kinds(arg) for arg in typing.get_args(annotation)))
    return set()
