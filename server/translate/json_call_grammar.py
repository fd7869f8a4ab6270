"""The grammar of tool calls written as JSON outside a format's tags (hermes' ``json_calls``: fenced or bare,
as Qwen 2.5 writes them) under ``tool_choice: "auto"``, so that such a call is held to its tool's schema as
a tagged one is (``server.translate.tools.call_grammar`` adds these rules to the tagged format's).

The reply stays free text until the model writes ``{"name": "`` where the parser
(``server.output.tool_formats.hermes``) would read a call: after prose, or right after a fence that may
hold calls (```` ```json ````, ```` ``` ````, ```` ```tool_call ````), alone or opening an array (three lazy
lexemes, as llama.cpp's lazy grammars are triggered by a pattern). Never inside a code block of another
language (```` ```python ````: the text before a trigger is prose in which every fence is closed) nor right
after a backtick (inline code): JSON there is code, which the parser leaves as content and the grammar
leaves free. Then the name decides: an offered one is a call, its arguments held to that tool's schema (a
fenced block is calls only, up to its closing fence: the parser reads a block as calls or as text, never
half of each); any other name (``{"name": "Alice", ...``) is the model's own JSON, free again (a fenced
one up to its closing fence). The triggers do not grow with the number of tools: the names are literals
after them, and "any other name" one regex (``other_names``).
"""

from __future__ import annotations

import json
import re

SPACE = r"[ \t\r\n]*"
_UNIT = r"([^`]|`[^`]|``[^`])"  # a character of prose, a backtick with the one after it: never a fence
PROSE = rf"({_UNIT}|```{_UNIT}*```)*"  # text in which every fence is closed (code, or JSON that was no call)
FENCE_OPEN = r"```(json|JSON|tool_call|tool_calls)?" + SPACE  # the fences the parser reads calls in
HEAD = rf'\{{{SPACE}"name"{SPACE}:{SPACE}"'  # up to the name's opening quote
_STRING_CHAR = r'([^"\\]|\\.)'


def other_names(names: list[str]) -> str:
    """The regex of a JSON string's rest after its opening quote (closing quote included) whose text is
    none of ``names``: it stops short of every name, leaves their trie somewhere, or goes on past one."""
    trie: dict = {}
    for name in names:
        node = trie
        for char in name:
            node = node.setdefault(char, {})
        node[""] = {}  # a name ends here

    def rest(node: dict) -> str:
        children = sorted(char for char in node if char)
        leave = "".join(re.escape(char) if char != "-" else r"\-" for char in children)
        options = [f'[^"\\\\{leave}]{_STRING_CHAR}*"', rf'\\.{_STRING_CHAR}*"']
        options += [re.escape(char) + rest(node[char]) for char in children]
        if "" not in node:
            options.append('"')
        return "(" + "|".join(options) + ")"

    return rest(trie)


def json_call_lines(names: list[str], arguments: list[str], one_per_group: bool) -> list[str]:
    """Lark lines defining ``lazy_group`` (JSON that is no call, then a call: a tagged group, ``tag_group``,
    or JSON naming an offered tool), ``last_group`` (the last such a reply with a most number of calls may
    make: nothing but a bare array's end after it) and ``free_tail`` (the text after the calls) for the
    tools ``names`` whose arguments' ``%json`` schemas are ``arguments``. ``one_per_group``: a fenced block
    holds one call (a reply's calls are counted in groups)."""
    more = "" if one_per_group else " (NEXT_OBJECT called)*"
    items = "" if one_per_group else " (NEXT_ITEM called)*"
    lines = [
        "lazy_group: no_call* (tag_group | fenced_group | bare_group)",
        "last_group: no_call* (tag_group | fenced_group | bare_group BARE_TAIL)",
        "free_tail: no_call* TEXT",
        "no_call: fenced_head OTHER_NAME FENCE_REST | listed_head OTHER_NAME FENCE_REST | bare_head OTHER_NAME",
        "fenced_group: fenced_head called" + more + " FENCE_END | listed_head called" + items + " LIST_END",
        "bare_group: bare_head called",
        "called: " + " | ".join(f"NAME_{i} rest_{i}" for i in range(len(names))),
        f"fenced_head[lazy]: /{PROSE}{FENCE_OPEN}{HEAD}/",
        f"listed_head[lazy]: /{PROSE}{FENCE_OPEN}\\[{SPACE}{HEAD}/",
        f"bare_head[lazy]: /{PROSE}{HEAD}/",
        f"OTHER_NAME: /{other_names(names)}/",
        f"FENCE_REST: /{_UNIT}*```/",
        f'ARGUMENTS_KEY: /{SPACE},{SPACE}"(arguments|parameters)"{SPACE}:{SPACE}/',
        f"OBJECT_END: /{SPACE}\\}}/",
        f"FENCE_END: /{SPACE}```/",
        f"LIST_END: /{SPACE}\\]{SPACE}```/",
        f"BARE_TAIL: /{SPACE}\\]?/",
        f"NEXT_OBJECT: /{SPACE}{HEAD}/",
        f"NEXT_ITEM: /{SPACE},{SPACE}{HEAD}/",
    ]
    for i, (name, schema) in enumerate(zip(names, arguments, strict=True)):
        lines += [f"NAME_{i}: {json.dumps(name + chr(34))}", f"rest_{i}: ARGUMENTS_KEY arguments_{i} OBJECT_END",
                  f"arguments_{i}: %json {schema}"]  # fmt: skip
    return lines
