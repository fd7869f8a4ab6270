"""Reading tool calls out of generated text (``--tool-call-parser``; vLLM's flag and names).

Each format of ``server.output.tool_formats`` gives a stream parser: ``PARSERS[name](offered)`` is a
stream that is fed text deltas and returns (content to release, calls completed), holding back text
that may be the start of a call so that no call text ever leaks into content; ``parse_whole`` runs a
whole reply through the same stream. What counts as a call, as OpenAI's own parser would have it: a
function among the offered ones with an object for arguments; anything else stays content. A reply
cut short (``finish(truncated=True)``, finish reason ``length``) drops its unfinished call.

``--tool-call-parser auto`` is resolved once the model is loaded (``resolve_parser``): the format whose
markers the chat template writes, else Hermes, and the start-up log says which and why.
"""

from __future__ import annotations

from collections.abc import Collection

from server.output.tool_formats import DEFAULT_FORMAT, FORMATS, ToolCall, ToolStream, detect_format, parse_whole
from server.output.tool_formats.calls import ParserFactory, StreamClass, parse_call
from server.output.tool_formats.hermes import CLOSE, OPEN, HermesStream

AUTO = "auto"
PARSERS: dict[str, StreamClass] = {name: fmt.stream for name, fmt in FORMATS.items()}


def parse_hermes(text: str, names: Collection[str] | None = None) -> tuple[str | None, list[ToolCall]]:
    """(content before and around the calls, or None when empty; the calls) of a whole Hermes reply."""
    return parse_whole(text, lambda: HermesStream(names))


def check_parser(name: str) -> None:
    if name != AUTO and name not in PARSERS:
        raise ValueError(f"--tool-call-parser {name!r} is not known; choose from {AUTO}, {', '.join(PARSERS)}")


def resolve_parser(name: str, chat_template: str | None) -> tuple[str, str]:
    """(the parser to use, what to log at start) for the setting ``name`` and the served chat template."""
    if name != AUTO:
        return name, f"tool calls are read as {name} (--tool-call-parser {name})"
    detected = detect_format(chat_template)
    if detected is not None:
        return (
            detected,
            f"tool calls are read as {detected} (--tool-call-parser auto): the chat template writes its markers",
        )
    why = "the model has no chat template" if not chat_template else "the chat template writes no known call markers"
    return DEFAULT_FORMAT, f"tool calls are read as {DEFAULT_FORMAT} (--tool-call-parser auto): {why}"


__all__ = ["AUTO", "CLOSE", "OPEN", "PARSERS", "HermesStream", "ParserFactory", "ToolCall", "ToolStream",
           "check_parser", "parse_call", "parse_hermes", "parse_whole", "resolve_parser"]  # fmt: skip
