"""Validation of the GenerationConfig knobs that shape the logits or the end.

``stop_strings``, ``sequence_bias``, ``exponential_decay_length_penalty``,
``begin_suppress_tokens``, ``forced_bos_token_id``, ``forced_eos_token_id``,
``renormalize_logits``, ``max_length``, ``min_length`` and ``token_healing`` keep HF's names and
meaning; this module checks them once at the edge (no torch here, like all of ``decoding.params``);
``decoding.params.lengths`` turns HF's total lengths (prompt included) into the engine's per-row
limits. What depends on the served model (token ids below the vocabulary, a prompt longer than ``max_length``) is in
``decoding.params.model_checks``.
"""

from __future__ import annotations

import math

from decoding.params.errors import ParameterError
from decoding.params.generation import GenerationParams
from decoding.params.lengths import forced_eos_ids, sequence_bias_ids


def _fail(param: str, message: str) -> None:
    raise ParameterError(message, param=param)


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def validate_knobs(params: GenerationParams) -> None:
    """Messages name the field, what it admits and the value, as HF's own checks would."""
    if params.token_healing:
        # HF's heal_tokens rewrites the prompt itself: it drops the prompt's last token and runs a
        # nested generate() constrained to tokens extending it, before decoding starts. The engine
        # admits a prompt's ids once (prefix cache, KV blocks, prompt logprobs), so the healed
        # prompt would have to be produced by a separate model call ahead of admission.
        raise ParameterError(
            "token_healing is not supported by this server: HF rewrites the prompt's tail with a nested "
            "generate() call before decoding, which the continuously batched engine does not run",
            param="token_healing",
            code="unsupported",
        )
    for text in params.stop_strings or []:
        if not isinstance(text, str) or not text:
            _fail("stop_strings", f"stop_strings must be non-empty strings, got {text!r}")
    for i, pair in enumerate(params.sequence_bias or []):
        ok = isinstance(pair, (list, tuple)) and len(pair) == 2
        ids, bias = (pair[0], pair[1]) if ok else (None, None)
        if not (ok and isinstance(ids, list) and ids and all(_is_id(t) for t in ids)):
            _fail("sequence_bias", f"sequence_bias[{i}] must be [token_ids, bias] with non-empty "
                                   f"non-negative token ids, got {pair!r}")  # fmt: skip
        if not (isinstance(bias, (int, float)) and not isinstance(bias, bool) and math.isfinite(bias)):
            _fail("sequence_bias", f"sequence_bias[{i}] bias must be a finite number, got {bias!r}")
    seen = [tuple(pair[0]) for pair in params.sequence_bias or []]
    if len(set(seen)) != len(seen):
        _fail("sequence_bias", "sequence_bias lists the same token_ids twice")
    decay = params.exponential_decay_length_penalty
    if decay is not None:
        ok = isinstance(decay, (list, tuple)) and len(decay) == 2 and _is_id(decay[0])
        factor = decay[1] if ok else None
        if not (ok and isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor > 0):
            _fail("exponential_decay_length_penalty", "exponential_decay_length_penalty must be "
                  f"[start_index >= 0, decay_factor > 0], got {decay!r}")  # fmt: skip
    for name in ("begin_suppress_tokens",):
        for token in getattr(params, name) or []:
            if not _is_id(token):
                _fail(name, f"{name} must be token ids >= 0, got {token!r}")
    if params.forced_bos_token_id is not None and not _is_id(params.forced_bos_token_id):
        _fail("forced_bos_token_id", f"forced_bos_token_id must be a token id >= 0, got {params.forced_bos_token_id!r}")
    forced_eos = forced_eos_ids(params)
    if params.forced_eos_token_id is not None and not (forced_eos and all(_is_id(t) for t in forced_eos)):
        _fail("forced_eos_token_id", "forced_eos_token_id must be a token id >= 0 or a non-empty list of them, "
              f"got {params.forced_eos_token_id!r}")  # fmt: skip
    if params.max_length is not None and not (_is_id(params.max_length) and params.max_length >= 1):
        _fail("max_length", f"max_length must be >= 1, got {params.max_length!r}")
    if not _is_id(params.min_length):
        _fail("min_length", f"min_length must be >= 0, got {params.min_length!r}")
    if params.max_length is not None and params.min_length > params.max_length:
        _fail("min_length", f"min_length ({params.min_length}) must not exceed max_length ({params.max_length})")


def check_knob_ids(params: GenerationParams, vocab_size: int) -> None:
    """Every token id these knobs name must be in the served model's vocabulary."""
    named = {
        "sequence_bias": sequence_bias_ids(params),
        "begin_suppress_tokens": params.begin_suppress_tokens or [],
        "forced_bos_token_id": [] if params.forced_bos_token_id is None else [params.forced_bos_token_id],
        "forced_eos_token_id": forced_eos_ids(params),
    }
    for name, ids in named.items():
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            _fail(name, f"{name} token ids must be in [0, {vocab_size - 1}] for this model, got {bad[0]}")


def check_max_length(params: GenerationParams, prompt_len: int, prompt_param: str) -> None:
    """``max_length`` counts the prompt: it must leave room for at least one new token.

    HF warns and still generates one token; a server answers a clear 400 instead."""
    if params.max_length is not None and params.max_length <= prompt_len:
        _fail("max_length", f"max_length ({params.max_length}) counts the prompt and must exceed its length "
              f"({prompt_len} tokens in the {prompt_param})")  # fmt: skip
    if params.max_length is not None and prompt_len + params.min_new_tokens > params.max_length:
        _fail("min_tokens", f"min_tokens ({params.min_new_tokens}) plus the {prompt_param}'s {prompt_len} tokens "
              f"must not exceed max_length ({params.max_length})")  # fmt: skip
