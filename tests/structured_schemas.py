"""JSON schemas of the kinds real APIs send as ``response_format``, each bounded so a random model
completes it well inside the test's token budget (strings with maxLength, integer ranges, maxItems,
numbers as enums: a free number may run to any length of decimals)."""

from __future__ import annotations

NAME = {"type": "string", "maxLength": 8}
SHORT = {"type": "string", "maxLength": 4}
AGE = {"type": "integer", "minimum": 0, "maximum": 120}
SCORE = {"type": "number", "enum": [0.25, 0.5, 0.75]}  # a free number may run to any length of decimals
FLAG = {"type": "boolean"}
COLOR = {"enum": ["red", "green", "blue"]}
STATUS = {"enum": ["open", "closed", None, 3]}


def obj(properties: dict, required: list[str] | None = None, **extra: object) -> dict:
    schema = {"type": "object", "properties": properties, "additionalProperties": False, **extra}
    if required is not None:
        schema["required"] = required
    return schema


def array(items: dict, low: int = 0, high: int = 3) -> dict:
    return {"type": "array", "items": items, "minItems": low, "maxItems": high}


HANDWRITTEN: list[dict] = [
    obj({"name": NAME, "age": AGE}, ["name", "age"]),
    obj({"name": NAME, "age": AGE}, ["name"]),
    obj({"name": NAME, "age": AGE}, []),
    obj({"ok": FLAG}, ["ok"]),
    obj({"color": COLOR}, ["color"]),
    obj({"status": STATUS}, ["status"]),
    obj({"score": SCORE}, ["score"]),
    obj({"tags": array(SHORT, 1, 3)}, ["tags"]),
    obj({"ids": array(AGE, 0, 4)}, ["ids"]),
    obj({"matrix": array(array(FLAG, 1, 2), 1, 2)}, ["matrix"]),
    obj({"user": obj({"name": NAME, "admin": FLAG}, ["name", "admin"])}, ["user"]),
    obj({"a": obj({"b": obj({"c": AGE}, ["c"])}, ["b"])}, ["a"]),
    obj({"items": array(obj({"sku": SHORT, "qty": AGE}, ["sku", "qty"]), 1, 2)}, ["items"]),
    obj({"value": {"anyOf": [AGE, FLAG]}}, ["value"]),
    obj({"value": {"anyOf": [NAME, {"type": "null"}]}}, ["value"]),
    obj({"shape": {"anyOf": [obj({"r": AGE}, ["r"]), obj({"w": AGE, "h": AGE}, ["w", "h"])]}}, ["shape"]),
    obj({"date": {"type": "string", "format": "date"}}, ["date"]),
    obj({"time": {"type": "string", "format": "time", "maxLength": 12}}, ["time"]),
    obj({"id": {"type": "string", "format": "uuid"}}, ["id"]),
    obj({"when": {"type": "string", "format": "date-time", "maxLength": 25}}, ["when"]),
    obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}, ["code"]),
    obj({"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, ["zip"]),
    obj({"hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"}}, ["hex"]),
    obj({"kind": {"const": "point"}, "x": AGE, "y": AGE}, ["kind", "x", "y"]),
    obj({"level": {"type": "integer", "enum": [1, 2, 3]}}, ["level"]),
    obj({"name": {"type": "string", "minLength": 2, "maxLength": 5}}, ["name"]),
    obj({"temp": {"type": "integer", "minimum": -50, "maximum": 50}}, ["temp"]),
    obj({"count": {"type": "integer", "minimum": 10, "maximum": 99}}, ["count"]),
    obj({"pair": {"type": "array", "prefixItems": [NAME, AGE], "items": False, "minItems": 2}}, ["pair"]),
    obj({"meta": obj({"k": SHORT}, [])}, ["meta"]),
    array(AGE, 1, 3),
    array(COLOR, 2, 2),
    COLOR,
    FLAG,
    AGE,
    {"type": "null"},
    obj({"first": NAME, "last": NAME, "email": {"type": "string", "format": "email", "maxLength": 20}}, ["first"]),
    obj({"event": {"enum": ["created", "deleted"]}, "at": {"type": "string", "format": "date"}}, ["event", "at"]),
    obj({"weather": obj({"city": NAME, "unit": {"enum": ["c", "f"]}}, ["city", "unit"])}, ["weather"]),
    obj({"answer": {"enum": ["yes", "no"]}, "confidence": SCORE}, ["answer", "confidence"]),
]


def generated() -> list[dict]:
    """Combinations: each field kind, alone and nested, required and optional."""
    fields = {"n": NAME, "a": AGE, "f": FLAG, "c": COLOR, "s": SCORE}
    out = []
    for key, kind in fields.items():
        out.append(obj({key: kind, "list": array(kind, 0, 2)}, [key]))
        out.append(obj({"outer": obj({key: kind}, [key])}, ["outer"]))
    return out


SCHEMAS: list[dict] = HANDWRITTEN + generated()
