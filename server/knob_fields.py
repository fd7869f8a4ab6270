"""The request fields of issue 11's GenerationConfig knobs, translated into ``GenerationParams``.

Names and JSON shapes are HF's, as ``GenerationConfig.to_json_string()`` writes them:
``sequence_bias`` is a list of ``[token_ids, bias]`` pairs, ``exponential_decay_length_penalty``
is ``[start_index, decay_factor]``, ``stop_strings`` a string or a list. Each falls back to the
model's generation_config.json (through ``pick``) when the request leaves it out.

``max_length`` and ``min_length`` count the prompt, as in HF. HF's precedence between the two
ways of giving a length is kept: a request's ``max_new_tokens`` (or OpenAI's ``max_tokens`` /
``max_completion_tokens``) wins over its ``max_length``, its ``min_new_tokens`` (``min_tokens``)
over its ``min_length``; a length the request gives beats one the model's file gives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Pick = Callable[[str, Any], Any]

KNOB_FIELDS = (
    "stop_strings", "sequence_bias", "exponential_decay_length_penalty", "begin_suppress_tokens",
    "forced_bos_token_id", "forced_eos_token_id", "renormalize_logits", "max_length", "min_length", "token_healing",
)  # fmt: skip


def knob_arguments(body: Any, pick: Pick, length_fields: dict[str, int | None]) -> dict[str, Any]:
    """``GenerationParams`` keyword arguments for the knob fields of ``body``.

    ``length_fields``: the max-new-tokens fields as the request sent them (None: not sent).
    """
    stop_strings = pick("stop_strings", None)
    sequence_bias = pick("sequence_bias", None)
    decay = pick("exponential_decay_length_penalty", None)
    gives_new = any(v is not None for v in length_fields.values())
    return {
        "stop_strings": [stop_strings] if isinstance(stop_strings, str) else stop_strings,
        "sequence_bias": None if sequence_bias is None else [_pair(p) for p in sequence_bias],
        "exponential_decay_length_penalty": None if decay is None else _pair(decay, tuple),
        "begin_suppress_tokens": pick("begin_suppress_tokens", None),
        "forced_bos_token_id": pick("forced_bos_token_id", None),
        "forced_eos_token_id": pick("forced_eos_token_id", None),
        "renormalize_logits": bool(pick("renormalize_logits", False)),
        # only the request's own max_length (the model's is not used: decoding.model_defaults says why)
        "max_length": None if gives_new else body.max_length,
        "min_length": _min_length(body, pick),
        "token_healing": bool(body.token_healing),
    }


def min_new_tokens(body: Any, pick: Pick) -> int:
    """The request's min_new_tokens (or vLLM's min_tokens); else none when it gives min_length; else the model's."""
    if body.min_new_tokens is not None or body.min_tokens is not None:
        return body.min_new_tokens if body.min_new_tokens is not None else body.min_tokens
    return 0 if body.min_length is not None else int(pick("min_new_tokens", 0) or 0)


def _min_length(body: Any, pick: Pick) -> int:
    if body.min_new_tokens is not None or body.min_tokens is not None:
        return 0  # HF: min_new_tokens wins over min_length
    if body.min_length is not None:
        return body.min_length
    return 0 if pick("min_new_tokens", 0) else int(pick("min_length", 0) or 0)  # the model's file: the same rule


def _pair(value: Any, kind: type = list) -> Any:
    """``[a, number]`` with the number as a float; anything else as sent, for validate() to name."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[1], (int, float)):
        first = list(value[0]) if isinstance(value[0], (list, tuple)) else value[0]
        return kind([first, float(value[1])])
    return kind(value) if isinstance(value, (list, tuple)) else value
