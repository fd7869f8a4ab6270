"""Which request fields give the same knob, and which length wins: one table, read by the
translation (``server.translate.params``) and by presets (``server.translate.presets``) alike.

A client may name one knob several ways: OpenAI's name, an older OpenAI name, vLLM's, HF's. Given
more than once, the values must agree (a 400 naming the later name otherwise). HF's own precedence
between its two ways of giving a length is kept: a count of new tokens (``max_new_tokens`` or any
name in its row) wins over the total that counts the prompt too (``max_length``), and the same for
the minimum. A preset's HF field gives way to any name in its row that the request set, and its
``do_sample`` to a ``temperature`` the request set (OpenAI's temperature 0 means greedy).

A new API adds its own names to a row here (the Responses API's ``max_output_tokens``, the Messages
API's ``max_tokens``); nothing else learns them.
"""

from __future__ import annotations

from typing import Any

from decoding import ParameterError

# the knob's HF name -> every body field that gives it, in the order an error names them
ALIASES: dict[str, tuple[str, ...]] = {
    "max_new_tokens": ("max_tokens", "max_completion_tokens", "max_output_tokens", "max_new_tokens"),
    "min_new_tokens": ("min_new_tokens", "min_tokens"),
    "num_return_sequences": ("n", "num_return_sequences"),
}
# HF's totals (prompt included), which a count of new tokens beats
TOTAL_LENGTHS: dict[str, str] = {"max_new_tokens": "max_length", "min_new_tokens": "min_length"}
# a preset's field that gives way to another knob the request set
DECIDED_BY: dict[str, tuple[str, ...]] = {"do_sample": ("temperature",)}
# names that are not HF's: a preset file (a GenerationConfig) cannot hold them
NOT_HF_NAMES = frozenset(name for knob, names in ALIASES.items() for name in names if name != knob)


def given(body: Any, knob: str) -> dict[str, Any]:
    """The names of ``knob`` (an ``ALIASES`` key) that ``body`` set to a value, with the values."""
    fields_set = body.model_fields_set
    return {
        name: getattr(body, name)
        for name in ALIASES[knob]
        if name in fields_set and getattr(body, name, None) is not None
    }


def check_agreement(body: Any) -> None:
    """Two names the request gives for one knob must agree."""
    for knob in ALIASES:
        values = given(body, knob)
        if len(set(values.values())) > 1:
            names = list(values)
            shown = ", ".join(f"{name} ({value})" for name, value in values.items())
            raise ParameterError(f"{shown} disagree; give one", param=names[-1])


def requested(body: Any, knob: str) -> Any:
    """The value the request itself gives ``knob`` under any of its names (they agree), else None."""
    return next(iter(given(body, knob).values()), None)


def total_length(body: Any, knob: str) -> Any:
    """The request's HF total for ``knob`` (``max_length``/``min_length``), unless it also gave a
    count of new tokens, which wins (HF's precedence)."""
    if requested(body, knob) is not None:
        return None
    return getattr(body, TOTAL_LENGTHS[knob])


def preset_gives_way(body: Any, knob: str) -> bool:
    """Whether the request already decided ``knob``, so a preset's value for it does not apply."""
    names = (*ALIASES.get(knob, (knob,)), *DECIDED_BY.get(knob, ()))
    return any(name in body.model_fields_set for name in names)
