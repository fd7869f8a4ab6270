"""HF's lengths and token lists as the engine counts them: per row, generated tokens only.

HF counts ``max_length`` and ``min_length`` over the prompt too, and takes one id or several for
``forced_eos_token_id``; the request state, the beams and the length processors all need the same
translation, so it is written once here, below them all.
"""

from __future__ import annotations

from decoding.params.generation import GenerationParams


def forced_eos_ids(params: GenerationParams) -> list[int]:
    """``forced_eos_token_id`` as a list (HF takes one id or several)."""
    value = params.forced_eos_token_id
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)


def new_token_limit(params: GenerationParams, prompt_len: int) -> int:
    """How many tokens a row may generate: ``max_length`` (HF's total, prompt included) when the
    request gave it instead of ``max_new_tokens``, else ``max_new_tokens``. HF's precedence:
    ``max_new_tokens`` wins when both are given (``server/translate/aliases.py``, the one table of
    names and length precedence, drops ``max_length`` then)."""
    if params.max_length is None:
        return params.max_new_tokens
    return params.max_length - prompt_len


def sequence_bias_ids(params: GenerationParams) -> list[int]:
    """Every token id ``sequence_bias`` names, for the vocabulary check."""
    return [t for ids, _ in params.sequence_bias or [] for t in ids]
