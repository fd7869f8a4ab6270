"""The Responses API's top-level fields about how OpenAI runs a response rather than what the model reads.

The ``openai`` SDK's ``ResponseCreateParams`` defines each; a client that builds its body from them
may send any, null or set, so each is honoured, accepted as the hint OpenAI documents it to be, or
refused with a 400 naming it when its value asks for what this server does not run
(``server.translate.unserved``'s rule; null, and a value that asks for nothing, are always accepted):

- ``max_tool_calls``: honoured: the most function calls the response makes (OpenAI: "further attempts
  to call a tool will be ignored"); the call grammar holds the reply to at most that many
  (``server.translate.tools``), and 0 makes none (the tools are then not offered);
- ``background_options`` (a completion window of "soonest", "2h" or "8h", a ``continuation_id`` that
  prioritises related background requests): hints, as a response here runs as soon as a slot is free,
  which meets every window;
- ``access_programs.cyber``: "standard" is what every request gets; the Daybreak programs (a model
  tier OpenAI grants per organisation) are not served;
- ``image.context_compression``: "auto" and "disabled" are what happens (no image is read here: image
  parts are refused); "enabled", which requires compression support, is not served;
- ``prompt`` (a prompt template stored on OpenAI's side), ``moderation`` (a moderation model run on the
  input and output) and ``context_management`` (server-side compaction of a long conversation) ask
  for what this server does not have: refused unless null (an empty ``context_management`` asks for
  nothing); ``truncation: "auto"`` is this server's answer to a conversation that outgrows the context.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from decoding import ParameterError
from server.translate.strict import Strict
from server.translate.unserved import refused_unless_null


def _standard_program(value: Any) -> Any:  # noqa: ANN401
    if value not in (None, "standard"):
        raise ParameterError(f"the access program {json.dumps(value)} is not served: this server runs no "
                             'access programs; every request gets "standard" (leave cyber out)')  # fmt: skip
    return value


def _no_compression_required(value: Any) -> Any:  # noqa: ANN401
    if value == "enabled":
        raise ParameterError('image context compression is not served: this server reads no images (image parts '
                             'are refused); send "auto" or "disabled", or leave it out')  # fmt: skip
    return value


class AccessPrograms(Strict):
    cyber: Annotated[Literal["standard", "daybreak_blue", "daybreak_red"] | None,
                     BeforeValidator(_standard_program)] = None  # fmt: skip


class BackgroundOptions(Strict):
    """Hints: a background response runs as soon as a slot is free, within any completion window."""

    completion_window: Literal["soonest", "2h", "8h"] | None = None
    continuation_id: str | None = None  # prioritises related background requests; adds no history


class ImageOptions(Strict):
    context_compression: Annotated[Literal["auto", "enabled", "disabled"] | None,
                                   BeforeValidator(_no_compression_required)] = None  # fmt: skip


NoPromptTemplate = refused_unless_null("prompt (a prompt template stored by OpenAI)", "this server keeps no prompt "
                                       "templates; send the template's text as instructions and input",
                                       kind=dict[str, Any])  # fmt: skip
NoModeration = refused_unless_null("moderation", "this server runs no moderation model", kind=dict[str, Any])
# each entry asks for compaction (an empty list asks for nothing)
Compaction = refused_unless_null("context_management (server-side compaction)", "this server keeps a conversation "
                                 'as it was sent; send truncation: "auto" to drop its oldest items when it outgrows '
                                 "the context", kind=dict[str, Any])  # fmt: skip


class RunOptions(Strict):
    """The fields above, as ``ResponsesRequest`` takes them (see the module's docstring)."""

    max_tool_calls: Annotated[int, Field(ge=0)] | None = None  # honoured: ToolUse.max_calls
    background_options: BackgroundOptions | None = None
    access_programs: AccessPrograms | None = None
    image: ImageOptions | None = None
    prompt: NoPromptTemplate = None
    moderation: NoModeration = None
    context_management: list[Compaction] | None = None
