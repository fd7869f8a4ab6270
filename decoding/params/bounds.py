"""The table of numeric ranges a request's knobs admit, by their API names.

One table serves both sides of the contract: ``validate`` enforces it and ``/openapi.json``
states it, so the documented range can never drift from the enforced one.
"""

from __future__ import annotations

from decoding.params.errors import Bounds, require
from decoding.params.generation import GenerationParams

MAX_CONTRASTIVE_TOP_K = 32  # the KV pool's scratch positions for candidates (strategies/contrastive.py)

MAX_N = 128
# request fields by their API names (OpenAI's where they differ from HF's): what validate() admits
BOUNDS: dict[str, Bounds] = {
    "max_tokens": Bounds(1),
    "min_tokens": Bounds(0),
    "temperature": Bounds(0, 100),
    "top_p": Bounds(0, 1, low_open=True),
    "top_k": Bounds(0),
    "min_p": Bounds(0, 1),
    "typical_p": Bounds(0, 1, low_open=True),
    "epsilon_cutoff": Bounds(0, 1, high_open=True),
    "eta_cutoff": Bounds(0, 1, high_open=True),
    "repetition_penalty": Bounds(0, low_open=True),
    "presence_penalty": Bounds(-2, 2),
    "frequency_penalty": Bounds(-2, 2),
    "no_repeat_ngram_size": Bounds(0),
    "n": Bounds(1, MAX_N),
    "logprobs": Bounds(0, 20),
    "max_time": Bounds(0, low_open=True),
    "logit_bias": Bounds(-100, 100),  # each value
    # HF takes any float; past +-50 a long beam's length ** length_penalty leaves a double's range
    # (65536 ** 64 overflows, 65536 ** -64 underflows to 0), and sensible values are within +-5
    "length_penalty": Bounds(-50, 50),
    "num_beams": Bounds(1),
    "num_beam_groups": Bounds(1),
    "penalty_alpha": Bounds(0, 1),
    "prompt_lookup_num_tokens": Bounds(1),
    "assistant_early_exit": Bounds(1),
    "num_assistant_tokens": Bounds(1),
    "max_matching_ngram_size": Bounds(1),
    "assistant_confidence_threshold": Bounds(0, 1),
    "guidance_scale": Bounds(0, 100, low_open=True),  # HF takes any float; useful ones are ~1-10
    "seed": Bounds(-(2**63), 2**64 - 1),  # what torch.Generator.manual_seed takes
    "priority": Bounds(-(2**31), 2**31 - 1),  # vLLM takes any int; a 32-bit one orders any scheme
}


# checked as they are; the others under their HF name or inside a strategy's checks
SIMPLE_BOUNDED = ("top_p", "top_k", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "repetition_penalty",
                  "presence_penalty", "frequency_penalty", "no_repeat_ngram_size", "n", "logprobs", "max_time",
                  "length_penalty", "priority")



def in_range(params: GenerationParams, name: str, value: float | None = None, shown: str | None = None) -> None:
    """``params.<name>`` (or ``value``) lies within ``BOUNDS[name]``; the message shows ``shown`` or ``name``."""
    value = getattr(params, name) if value is None else value
    if value is None:
        return
    require(BOUNDS[name].admits(value), name, f"{shown or name} must be {BOUNDS[name].describe()}, got {value}")
