"""Known mistakes in models' own chat templates, mended before the template is served.

Qwen2.5-Coder-Instruct's template (every size; the GGUFs carry it too) writes its tool-call example
inside a Jinja string literal as ``{{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}}``:
the author escaped the braces as if they were in template text, but in a string they are printed as
they are, so the model is shown ``{{"name": ...}}`` (Qwen 2.5's other templates show ``{"name": ...}``).
The model then copies the doubled braces into its calls (``{{"name": "get_weather", "arguments":
{"city": "Lisbon"}}}``, with closing braces that do not even balance), which no parser can read as
JSON. Mended, it writes the single object its own example means. A template without the mistake is
served unchanged, and the start-up log says when a mend was made.
"""

from __future__ import annotations

# (what the faulty template holds, what it means, why): matched as exact text, so nothing else changes
MENDS: tuple[tuple[str, str, str], ...] = (
    (
        '{{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}}',
        '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}',
        "Qwen2.5-Coder's tool-call example showed doubled braces, which the model copies into its calls",
    ),
)


def mend_chat_template(source: str) -> tuple[str, list[str]]:
    """``source`` with each known mistake mended, and why each mend was made (empty: served as it is)."""
    reasons = []
    for faulty, meant, why in MENDS:
        if faulty in source:
            source = source.replace(faulty, meant)
            reasons.append(why)
    return source, reasons
