"""``--lora-modules``: vLLM's two spellings of an adapter to load at start, read into (name, path, base).

``NAME=PATH``, or vLLM's JSON object ``{"name": ..., "path": ..., "base_model_name": ...}``. The flag
is repeatable; the environment and config/server.yaml give several comma-separated, so commas inside a
JSON object (between its keys) do not split it.
"""

from __future__ import annotations

import json

JSON_KEYS = {"name", "path", "base_model_name"}


def parse_lora_modules(spec: str | None) -> list[tuple[str, str, str | None]]:
    """``'a=/lora/a,{"name": "b", "path": "/lora/b", "base_model_name": "m"}'`` ->
    ``[("a", "/lora/a", None), ("b", "/lora/b", "m")]``; a malformed item is a ValueError naming it."""
    modules: list[tuple[str, str, str | None]] = []
    for item in _split_top_level(spec or ""):
        if item.startswith("{"):
            modules.append(_from_json(item))
            continue
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"--lora-modules {item!r}: expected NAME=PATH or a JSON object with name and path")
        modules.append((name.strip(), path.strip(), None))
    names = [name for name, _, _ in modules]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise ValueError(f"--lora-modules names {', '.join(duplicated)} more than once")
    return modules


def _from_json(item: str) -> tuple[str, str, str | None]:
    try:
        data = json.loads(item)
    except json.JSONDecodeError as error:
        raise ValueError(f"--lora-modules {item!r}: not valid JSON ({error.msg})") from None
    unknown = set(data) - JSON_KEYS
    if unknown:
        raise ValueError(f"--lora-modules {item!r}: unknown keys {sorted(unknown)} (vLLM's are name, path, "
                         "base_model_name)")  # fmt: skip
    if not isinstance(data.get("name"), str) or not isinstance(data.get("path"), str):
        raise ValueError(f"--lora-modules {item!r}: name and path must be strings")
    base = data.get("base_model_name")
    if base is not None and not isinstance(base, str):
        raise ValueError(f"--lora-modules {item!r}: base_model_name must be a string")
    return data["name"], data["path"], base


def _split_top_level(spec: str) -> list[str]:
    """Split on commas outside JSON objects and strings."""
    items, current, depth, in_string, escaped = [], [], 0, False, False
    for char in spec:
        if in_string:
            escaped = char == "\\" and not escaped
            in_string = not (char == '"' and not escaped)
        elif char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    items.append("".join(current).strip())
    return [item for item in items if item]
