"""Which keys of a model's ``generation_config.json`` become request defaults, and why not the rest.

Precedence is request > named preset > the model's generation_config.json > server defaults, so
a model that ships ``temperature: 0.6`` or ``repetition_penalty: 1.1`` decodes as its authors
intended unless the request says otherwise. Every key the file sets is sorted here into
``honoured`` (passed on as defaults, under HF's name) or ``ignored`` with the reason, and both
lists are logged once at load: nothing in the file is dropped silently.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

# knobs that default per request exactly as HF reads them (server/translate/params.py maps them to fields)
HONOURED = frozenset({
    "do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff",
    "repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "suppress_tokens", "begin_suppress_tokens",
    "sequence_bias", "exponential_decay_length_penalty", "forced_bos_token_id", "forced_eos_token_id",
    "renormalize_logits", "min_length", "min_new_tokens", "max_new_tokens", "max_time", "stop_strings",
    # beam-only knobs: defaults for requests that ask for beam search (num_beams > 1) themselves
    "length_penalty", "early_stopping", "diversity_penalty",
})  # fmt: skip

_STRATEGY = (
    "selects a decoding strategy; the server resolves the strategy from the request alone (an OpenAI "
    "client's temperature must keep its meaning), so send it per request"
)
_ENGINE = "engine plumbing (cache, compilation, batching, outputs), owned by the server, not a decoding choice"
IGNORED_REASONS: dict[str, str] = {
    **dict.fromkeys(
        ("num_beams", "num_beam_groups", "num_return_sequences", "penalty_alpha", "dola_layers",
         "prompt_lookup_num_tokens", "max_matching_ngram_size", "num_assistant_tokens",
         "num_assistant_tokens_schedule", "assistant_confidence_threshold", "assistant_early_exit",
         "assistant_lookbehind", "target_lookbehind", "assistant_ensemble_weight", "speculation_type", "use_mtp",
         "guidance_scale", "watermarking_config", "is_assistant"),
        _STRATEGY,
    ),
    **dict.fromkeys(
        ("cache_implementation", "cache_config", "max_cache_len", "compile_config", "disable_compile", "low_memory",
         "prefill_chunk_size", "continuous_batching_config", "use_cache", "output_attentions", "output_hidden_states",
         "output_scores", "output_logits", "return_dict_in_generate", "transformers_version", "_from_model_config"),
        _ENGINE,
    ),
    "max_length": "a total-length default would let the prompt's length decide whether a request is accepted; "
    "the API's length default applies (max_tokens), and a request may send max_length itself",
    "token_healing": "not supported by this server (HF rewrites the prompt with a nested generate() call)",
    "remove_invalid_values": "not supported: a request whose scores turn inf/nan fails with a 400 instead",
    "top_h": "not supported by this server",
    "constraints": "removed from transformers 5 (constrained beam search)",
    "force_words_ids": "removed from transformers 5 (constrained beam search)",
    "encoder_repetition_penalty": "applies to encoder-decoder models; this server serves decoder-only models",
    "encoder_no_repeat_ngram_size": "applies to encoder-decoder models; this server serves decoder-only models",
    "decoder_start_token_id": "applies to encoder-decoder models; this server serves decoder-only models",
    "bos_token_id": "a token id, not a decoding default",
    "pad_token_id": "a token id, not a decoding default (padding is the engine's business)",
    "eos_token_id": "used as the model's eos ids, not as a request default",
}


def split_generation_defaults(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``values``: the keys a generation_config.json sets (``GenerationConfig.to_diff_dict()``).

    Returns (honoured defaults in the form requests use, {ignored key: why}).
    """
    honoured: dict[str, Any] = {}
    ignored: dict[str, str] = {}
    for key, value in values.items():
        if key in HONOURED:
            if value is not None:
                honoured[key] = _as_request_value(key, value)
        else:
            ignored[key] = IGNORED_REASONS.get(key, "not a GenerationConfig knob this server knows")
    return honoured, ignored


def _as_request_value(key: str, value: Any) -> Any:
    """GenerationConfig's in-memory forms into the request's JSON forms."""
    if key == "sequence_bias" and isinstance(value, dict):  # {(ids...): bias} -> [[ids], bias]
        return [[list(ids), float(bias)] for ids, bias in value.items()]
    if key == "stop_strings" and isinstance(value, str):
        return [value]
    if key == "exponential_decay_length_penalty":
        return tuple(value)
    return value


def log_generation_defaults(served_name: str, honoured: dict[str, Any], ignored: dict[str, str]) -> None:
    """One line for what the model's generation_config.json sets that the server uses, one per key it does not."""
    if honoured:
        logger.info("model %s: generation_config.json defaults used: %s", served_name, honoured)
    for key, reason in sorted(ignored.items()):
        logger.info("model %s: generation_config.json %s not used: %s", served_name, key, reason)
