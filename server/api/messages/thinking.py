"""Anthropic's ``thinking`` on the Messages API: the request's setting, and the thinking blocks a client sends back.

Where the server splits a reasoning model's thinking (``--reasoning-parser``, ``server.output.reasoning``):

- left out, or ``{"type": "adaptive"}`` (the model decides whether and how much to think): the reply
  is split as the model writes it, the thinking a ``thinking`` block first;
- ``{"type": "enabled", "budget_tokens": N}``: the same, and the thinking is cut at ``N`` tokens by
  forcing the parser's end tag (``</think>``) in the engine (``decoding.params.thinking``), then the
  answer follows. Anthropic's rules hold: ``budget_tokens`` at least 1024 and below ``max_tokens``
  (the thinking counts toward it);
- ``{"type": "disabled"}``: the chat template gets ``enable_thinking: false`` (Qwen3's and the
  reasoning templates' switch, as chat's ``chat_template_kwargs``) and the reply is not split.

Without a parser the served model has no separate thinking: ``enabled`` is a 400 saying so (nothing
could honour the budget), ``adaptive`` and ``disabled`` are what it does anyway. ``display:
"omitted"`` returns the thinking block with its text left out, as Anthropic's (no signature here:
nothing signs it); ``"summarized"`` returns it whole (the model writes no summary). ``between_tools``
(thinking off, progress notes between tool calls as thinking blocks) is a 400: the model writes no
such notes.

``thinking`` and ``redacted_thinking`` blocks in an assistant turn (a client replaying the reply it
got, as every tool loop does) are accepted and not rendered, as the Responses API keeps a replayed
``reasoning`` item out of the prompt and as reasoning models' templates drop earlier turns' thinking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from decoding import ParameterError
from server.output.reasoning import ReasoningFormat
from server.translate.strict import Strict

MIN_BUDGET = 1024  # Anthropic's


class ThinkingBlock(Strict):
    """A reply's thinking sent back: accepted, not rendered (see the module's docstring)."""

    type: Literal["thinking"]
    thinking: str
    signature: str


class RedactedThinkingBlock(Strict):
    """Another server's redacted thinking sent back: accepted, not rendered (its data is opaque)."""

    type: Literal["redacted_thinking"]
    data: str


Display = Literal["summarized", "omitted"] | None


class ThinkingEnabled(Strict):
    type: Literal["enabled"]
    budget_tokens: int
    display: Display = None


class ThinkingAdaptive(Strict):
    type: Literal["adaptive"]
    display: Display = None


class ThinkingDisabled(Strict):
    type: Literal["disabled"]


def _served_thinking(value: Any) -> Any:  # noqa: ANN401
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "between_tools":
        raise ParameterError('thinking of type "between_tools" is not served: the served model writes no progress '
                             'notes between tool calls; send "disabled", "adaptive" or "enabled"',
                             param="thinking")  # fmt: skip
    if kind == "enabled" and isinstance(value.get("budget_tokens"), int) and value["budget_tokens"] < MIN_BUDGET:
        raise ParameterError(f"thinking.budget_tokens must be at least {MIN_BUDGET}, got {value['budget_tokens']}",
                             param="thinking.budget_tokens")  # fmt: skip
    return value


ThinkingConfig = Annotated[
    ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled, Field(discriminator="type"),
    BeforeValidator(_served_thinking),
]  # fmt: skip


def check_budget(thinking: ThinkingConfig | None, max_tokens: int) -> None:
    """Anthropic's rule: the budget is below ``max_tokens``, which counts the thinking too."""
    if isinstance(thinking, ThinkingEnabled) and thinking.budget_tokens >= max_tokens:
        raise ParameterError(f"max_tokens ({max_tokens}) must be greater than thinking.budget_tokens "
                             f"({thinking.budget_tokens}): the thinking counts toward max_tokens",
                             param="thinking.budget_tokens")  # fmt: skip


@dataclass(frozen=True)
class ThinkingPlan:
    """What a message's ``thinking`` does: the split (None: none), the template's variables, the budget."""

    reasoning: ReasoningFormat | None
    template_kwargs: dict[str, Any] | None = None
    budget: int | None = None
    show: bool = True  # false: display "omitted"


def thinking_plan(thinking: ThinkingConfig | None, reasoning: ReasoningFormat | None) -> ThinkingPlan:
    """The plan for the request's ``thinking`` on a server whose split is ``reasoning`` (None: no parser)."""
    if isinstance(thinking, ThinkingDisabled):
        return ThinkingPlan(None, {"enable_thinking": False})
    show = thinking is None or thinking.display != "omitted"
    if isinstance(thinking, ThinkingEnabled):
        if reasoning is None:
            raise ParameterError('thinking of type "enabled" needs a reasoning model: this server was started '
                                 "without --reasoning-parser, so the served model has no separate thinking to "
                                 'budget; leave thinking out or send {"type": "disabled"}',
                                 param="thinking")  # fmt: skip
        return ThinkingPlan(reasoning, budget=thinking.budget_tokens, show=show)
    return ThinkingPlan(reasoning, show=show)
