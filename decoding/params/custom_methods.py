"""Custom decoding methods (HF's ``custom_generate``): what a request may ask of one, torch-free.

A method is a ``generate(model, input_ids, generation_config=None, ...)`` function in
``PATH/custom_generate/generate.py``, registered with ``decoda serve --custom-generate NAME=PATH``
and loaded at start by ``decoding.custom.loading``. This module holds what the HTTP layer and
``params.validate`` need without torch: the registry's public face (``CustomMethodInfo``, listed
by ``GET /v1/custom_generate``) and the request checks.

A request's extra fields become the method's keyword arguments. Only parameters the function
names are accepted: HF's own ``generate(custom_generate=...)`` swallows anything into
``**kwargs``, which would silently ignore a typo; here a name the method does not take is a 400
naming it. The arguments Decoda supplies itself (the prompt, the generation config, the streamer,
the stopping criteria) cannot be set by a request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from decoding.params.errors import ParameterError
from decoding.params.generation import GenerationParams

# keyword arguments Decoda passes itself (HF's generate() passes the same names to a custom method)
SUPPLIED_ARGUMENTS = ("model", "input_ids", "generation_config", "streamer", "stopping_criteria")
# arguments of HF's generate() that a request cannot express, and that a method may also name
RESERVED_ARGUMENTS = (
    *SUPPLIED_ARGUMENTS, "inputs", "logits_processor", "prefix_allowed_tokens_fn", "synced_gpus",
    "assistant_model", "negative_prompt_ids", "negative_prompt_attention_mask", "use_model_defaults",
    "attention_mask", "kwargs",
)  # fmt: skip
# GenerationParams fields that are GenerationConfig knobs, handed to the method in ``generation_config``
# (every knob a model's generation_config.json may default is one: a model default never refuses a request)
CONFIG_FIELDS = (
    "max_new_tokens", "min_new_tokens", "do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p",
    "epsilon_cutoff", "eta_cutoff", "repetition_penalty", "no_repeat_ngram_size", "bad_words_ids",
    "suppress_tokens", "max_time", "begin_suppress_tokens", "sequence_bias", "exponential_decay_length_penalty",
    "forced_bos_token_id", "forced_eos_token_id", "renormalize_logits", "min_length", "stop_strings",
    "length_penalty", "early_stopping", "diversity_penalty",
)  # fmt: skip
# what else a custom request may carry: the job honours these itself
SERVED_FIELDS = ("custom_generate", "custom_generate_args", "seed", "skip_special_tokens", "generation_preset")
# serving features the exclusive job cannot provide: the method returns one sequence of token ids
_UNSUPPORTED = {
    "n": lambda p: p.n != 1 or p.num_return_sequences != 1,
    "logprobs": lambda p: p.logprobs is not None or p.prompt_logprobs is not None,
    "stop": lambda p: bool(p.stop),
    "stop_token_ids": lambda p: bool(p.stop_token_ids),
    "logit_bias": lambda p: bool(p.logit_bias),
    "presence_penalty": lambda p: p.presence_penalty != 0,
    "frequency_penalty": lambda p: p.frequency_penalty != 0,
    "ignore_eos": lambda p: p.ignore_eos,
    "num_beams": lambda p: p.num_beams != 1 or p.num_beam_groups != 1,
    "penalty_alpha": lambda p: p.penalty_alpha is not None,
    "dola_layers": lambda p: p.dola_layers is not None,
    "assistant_model": lambda p: p.assistant_model is not None,
    "prompt_lookup_num_tokens": lambda p: p.prompt_lookup_num_tokens is not None,
    "assistant_early_exit": lambda p: p.assistant_early_exit is not None,
}


@dataclass(frozen=True)
class CustomMethodInfo:
    """One registered method: its name, where it came from, and the arguments a request may set."""

    name: str
    path: str
    arguments: tuple[str, ...]  # keyword parameters of generate() a request may set
    description: str = ""  # the first line of the function's docstring

    def as_json(self) -> dict[str, object]:
        """What ``GET /v1/custom_generate`` shows: never ``path``, a location on the server's disk."""
        return {"id": self.name, "object": "custom_generate", "arguments": list(self.arguments),
                "description": self.description}  # fmt: skip


def parse_custom_generate(spec: str | None) -> list[tuple[str, str]]:
    """``"echo=cfg/echo,look=cfg/look"`` -> ``[("echo", "cfg/echo"), ("look", "cfg/look")]``."""
    out: list[tuple[str, str]] = []
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"--custom-generate expects NAME=PATH, got {item!r}")
        out.append((name.strip(), path.strip()))
    names = [name for name, _ in out]
    if len(set(names)) != len(names):
        raise ValueError(f"--custom-generate names must be unique, got {names}")
    return out


def require_trust(specs: list[tuple[str, str]], trust_remote_code: bool) -> None:
    """Refuse to start when code would be loaded without ``--trust-remote-code`` (checked before the model loads)."""
    if specs and not trust_remote_code:
        names = ", ".join(f"{name}={path}" for name, path in specs)
        raise ValueError(
            f"--custom-generate {names} runs the Python code in PATH/custom_generate/generate.py; "
            "start the server with --trust-remote-code to allow it"
        )
    for name, path in specs:
        if not (Path(path) / "custom_generate" / "generate.py").is_file():
            raise ValueError(f"--custom-generate {name}={path}: {path}/custom_generate/generate.py does not exist")


def validate_custom(params: GenerationParams) -> None:
    """Request-only checks (``params.validate``): arguments need a method; features it cannot serve are 400s."""
    args = params.custom_generate_args or {}
    if params.custom_generate is None:
        if args:
            name = next(iter(args))
            raise ParameterError(f"Unrecognized request argument supplied: {name}", param=name, code="unknown_field")
        return
    for name, unsupported in _UNSUPPORTED.items():
        if unsupported(params):
            raise ParameterError(
                f"{name} cannot be combined with custom_generate: the method '{params.custom_generate}' decodes "
                "one sequence by itself",
                param=name,
            )
    _check_unused_knobs(params)
    for name in args:
        if name in RESERVED_ARGUMENTS:
            raise ParameterError(
                f"{name} is supplied by the server to custom_generate methods; a request cannot set it", param=name
            )


def _check_unused_knobs(params: GenerationParams) -> None:
    """Any other knob (one a later feature adds included) would go unused by the method: a 400 naming it."""
    defaults = GenerationParams()
    for f in dataclasses.fields(GenerationParams):
        if f.name not in CONFIG_FIELDS + SERVED_FIELDS and getattr(params, f.name) != getattr(defaults, f.name):
            raise ParameterError(
                f"{f.name} cannot be combined with custom_generate: the method '{params.custom_generate}' gets "
                f"only {', '.join(CONFIG_FIELDS)} (in generation_config) and its own arguments",
                param=f.name,
            )


def check_custom_method(params: GenerationParams, methods: Mapping[str, CustomMethodInfo]) -> None:
    """Against the server's registry: the method exists and takes every extra field the request sent."""
    if params.custom_generate is None:
        return
    _check_unused_knobs(params)  # again: server defaults (say, --watermark) were added after validate()
    method = methods.get(params.custom_generate)
    if method is None:
        raise ParameterError(
            f"unknown custom_generate '{params.custom_generate}'; registered methods: {sorted(methods) or 'none'} "
            "(decoda serve --custom-generate NAME=PATH)",
            param="custom_generate",
        )
    for name in params.custom_generate_args or {}:
        if name not in method.arguments:
            raise ParameterError(
                f"Unrecognized request argument supplied: {name} (custom_generate '{method.name}' takes "
                f"{', '.join(method.arguments) or 'no arguments'})",
                param=name,
                code="unknown_field",
            )
