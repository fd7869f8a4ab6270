"""The tool-call formats of the model families served, one module each, in one table (``FORMATS``,
keyed by vLLM's ``--tool-call-parser`` names): how a reply's calls are read (whole or streamed) and the
pieces of the grammar that forces them (``server.translate.tools`` builds it from these).

``detect_format`` is ``--tool-call-parser auto``: the format whose markers the served chat template
writes (most telling first: GPT-OSS's ``<|call|>`` before Mistral's ``[TOOL_CALLS]``, Llama 4's
``<|python_start|>`` before Llama 3's ``<|python_tag|>``, Hermes' ``<tool_call>`` last).
"""

from __future__ import annotations

from server.output.tool_formats.calls import ToolCall, ToolFormat, ToolStream, parse_whole
from server.output.tool_formats.harmony import HARMONY
from server.output.tool_formats.hermes import HERMES
from server.output.tool_formats.llama3_json import LLAMA3_JSON
from server.output.tool_formats.mistral import MISTRAL
from server.output.tool_formats.pythonic import PYTHONIC

DETECTION_ORDER = (HARMONY, MISTRAL, PYTHONIC, LLAMA3_JSON, HERMES)
FORMATS: dict[str, ToolFormat] = {fmt.name: fmt for fmt in (HERMES, LLAMA3_JSON, PYTHONIC, MISTRAL, HARMONY)}
DEFAULT_FORMAT = HERMES.name


def detect_format(chat_template: str | None) -> str | None:
    """The format whose markers ``chat_template`` writes, or None when none does (or there is none)."""
    if not chat_template:
        return None
    for fmt in DETECTION_ORDER:
        if any(marker in chat_template for marker in fmt.markers):
            return fmt.name
    return None


__all__ = ["DEFAULT_FORMAT", "FORMATS", "ToolCall", "ToolFormat", "ToolStream", "detect_format", "parse_whole"]
