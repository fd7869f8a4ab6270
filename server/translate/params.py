"""What a request body means: ``GenerationFields`` into ``decoding.GenerationParams``, for every API.

The body (``server.translate.fields`` plus its API's own fields) holds what the client sent; this
module owns OpenAI's meaning of it (temperature 0 is greedy, ``n``, ``stop``, ``logprobs``) and where
each knob left out comes from: request > preset > the model's generation_config.json > server default
(``Defaults``; a preset is already merged into the request by ``server.translate.presets``). Which
names give one knob and which length wins is ``server.translate.aliases``' table. Names and JSON
shapes of the GenerationConfig knobs are HF's, as ``GenerationConfig.to_json_string()`` writes them.

The body's constraint and its tools are folded in here too (``_constraint``), so
``decoding.params.validate`` checks the finished params exactly once, at the end of ``to_params``,
before any template or tokenizer runs. What is checked here instead only makes sense on the request
as sent: aliases that disagree, a warper set on a greedy request (the params cannot tell it from a
model default) and OpenAI's temperature range before 0 turns into greedy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from decoding import GenerationParams, ParameterError
from decoding.params import BOUNDS, validate
from decoding.params.model_defaults import HONOURED
from decoding.params.structured import StructuredOutput
from server.translate import aliases
from server.translate.fields import GenerationFields

# knobs a model's generation_config.json may default (request > model > server default); the keys it
# sets that the server does not use are logged at load with the reason (decoding.model_defaults)
MODEL_DEFAULTABLE = tuple(sorted(HONOURED))
WARPERS = ("top_k", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")
SAMPLING_ONLY = ("do_sample", "temperature", "top_p", *WARPERS)


@dataclass(frozen=True)
class Defaults:
    """Where a knob's value comes from: the field the request set (not to null), else the model's
    generation_config.json, else the server's default named by the caller."""

    body: GenerationFields
    model: dict[str, Any]  # the model's generation_config knobs this server honours

    @classmethod
    def of(cls, body: GenerationFields, model_defaults: dict[str, Any] | None) -> Defaults:
        return cls(body, {k: v for k, v in (model_defaults or {}).items() if k in MODEL_DEFAULTABLE})

    def resolve(self, name: str, server_default: Any) -> Any:
        value = getattr(self.body, name)
        if name in self.body.model_fields_set and value is not None:
            return value
        return self.model.get(name, server_default)


def to_params(
    body: GenerationFields,
    *,
    default_max_tokens: int,
    model_defaults: dict[str, Any] | None = None,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
) -> GenerationParams:
    """The validated params of ``body``; a wrong field is a ``ParameterError`` naming it."""
    defaults = Defaults.of(body, model_defaults)
    temperature = checked_temperature(defaults)
    do_sample = samples(body, defaults, temperature)
    if not do_sample:
        refuse_warpers(body)
    aliases.check_agreement(body)
    constraint, tools = _constraint(body)
    params = GenerationParams(  # grouped in the order the values are worked out
        max_new_tokens=max_new_tokens(body, defaults, default_max_tokens),
        min_new_tokens=min_new_tokens(body, defaults),
        ignore_eos=body.ignore_eos,
        max_time=defaults.resolve("max_time", None),
        do_sample=do_sample,
        temperature=float(temperature) if do_sample else 1.0,
        **_processor_arguments(defaults),
        **_beam_arguments(body, defaults),
        **_strategy_arguments(body),
        **_output_arguments(body, logprobs, prompt_logprobs, shows_special_tokens=tools),
        **_hf_knob_arguments(body, defaults),
        watermarking_config=body.watermarking_config.config() if body.watermarking_config else None,
        guidance_scale=body.guidance_scale,
        negative_prompt=body.negative_prompt,
        structured_output=constraint,
        negative_prompt_ids=body.negative_prompt_ids,
        custom_generate_args=dict(body.custom_generate_args) or None,
        priority=body.priority,
    )
    validate(params)
    return params


# ---- greedy or sampling ------------------------------------------------------------------------------
def checked_temperature(defaults: Defaults) -> float:
    """OpenAI's temperature (default 1), range-checked here: a greedy request's params carry temperature 1."""
    temperature = defaults.resolve("temperature", 1.0)
    bounds = BOUNDS["temperature"]
    if not bounds.admits(temperature):
        raise ParameterError(f"temperature must be {bounds.describe()}, got {temperature}", param="temperature")
    return temperature


def samples(body: GenerationFields, defaults: Defaults, temperature: float) -> bool:
    """Whether the request samples: its ``do_sample``; else what a temperature it sent means (0: greedy);
    else the model's ``do_sample``; else whether the default temperature is above 0."""
    if "do_sample" in body.model_fields_set and body.do_sample is not None:
        return body.do_sample
    if "temperature" in body.model_fields_set:
        return temperature > 0
    return bool(defaults.model.get("do_sample", temperature > 0))


def is_greedy(body: GenerationFields) -> bool:
    """Whether the request itself asks for greedy decoding (``do_sample: false``, else ``temperature: 0``),
    before any default: a preset's sampling knobs give way to it (``server.translate.presets``)."""
    if "do_sample" in body.model_fields_set:
        return body.do_sample is False
    return "temperature" in body.model_fields_set and body.temperature == 0


def sampling_only(name: str, penalty_alpha: float | None) -> bool:
    """Whether knob ``name`` matters only when sampling; under contrastive search (``penalty_alpha``)
    ``top_k`` is the number of candidates, so it matters without sampling too."""
    return name in SAMPLING_ONLY and not (name == "top_k" and penalty_alpha)


def refuse_warpers(body: GenerationFields) -> None:
    """A warper the greedy request set itself is a 400 (its params could not tell it from a model default)."""
    for name in WARPERS:
        sent = name in body.model_fields_set and getattr(body, name) not in (None, 0)
        if sent and sampling_only(name, body.penalty_alpha):
            raise ParameterError(
                f"{name} only applies when sampling; this request is greedy (temperature 0 or do_sample false)",
                param=name,
            )


# ---- lengths -----------------------------------------------------------------------------------------
# ``max_length`` and ``min_length`` count the prompt, as in HF; which name wins is ``aliases``' rule.
def max_new_tokens(body: GenerationFields, defaults: Defaults, default_max_tokens: int) -> int | None:
    """The request's own limit (its names agree), else the model's, else the endpoint's."""
    given = aliases.requested(body, "max_new_tokens")
    return given if given is not None else defaults.model.get("max_new_tokens", default_max_tokens)


def length_is_given(body: GenerationFields, model_defaults: dict[str, Any] | None) -> bool:
    """Whether the request or the model sets the new-token limit (else the endpoint's default does)."""
    return aliases.requested(body, "max_new_tokens") is not None or "max_new_tokens" in (model_defaults or {})


def min_new_tokens(body: GenerationFields, defaults: Defaults) -> int:
    """The request's min_new_tokens (or vLLM's min_tokens); else none when it gives min_length; else the model's."""
    given = aliases.requested(body, "min_new_tokens")
    if given is not None:
        return given
    return 0 if body.min_length is not None else int(defaults.resolve("min_new_tokens", 0) or 0)


def max_length(body: GenerationFields) -> int | None:
    """Only the request's own max_length (the model's is not used: decoding.model_defaults says why)."""
    return aliases.total_length(body, "max_new_tokens")


def min_length(body: GenerationFields, defaults: Defaults) -> int:
    if aliases.requested(body, "min_new_tokens") is not None:
        return 0  # HF: min_new_tokens wins over min_length
    if body.min_length is not None:
        return body.min_length
    # the model's file: the same rule
    return 0 if defaults.resolve("min_new_tokens", 0) else int(defaults.resolve("min_length", 0) or 0)


def with_context_default(params: GenerationParams, room: int) -> GenerationParams:
    """An endpoint whose default length is what the context leaves (chat, as OpenAI): known only once
    the prompt is rendered, after ``to_params`` validated the rest; at least 1, so a prompt that fills
    the context is then a context-length error naming the prompt's field."""
    limit = max(1, room)
    if params.max_length is None and params.min_new_tokens > limit:
        raise ParameterError(f"min_tokens ({params.min_new_tokens}) must not exceed max_tokens ({limit}, what the "
                             "context leaves after the prompt)", param="min_tokens")  # fmt: skip
    return params.replace(max_new_tokens=limit)


# ---- the body's constraint and tools -----------------------------------------------------------------
def _constraint(body: GenerationFields) -> tuple[StructuredOutput | None, bool]:
    """(the reply's one constraint, whether tools are offered): offered tools constrain every call the
    reply makes (``server.translate.tools``); the body's own constraint then shapes a reply that calls
    nothing, where the tool choice lets the model answer at all."""
    structured = body.structured_output()
    tool_use = body.tool_use()
    if tool_use is None:
        return structured, False
    tool_use.check()
    if not tool_use.offered():
        return structured, False
    return tool_use.grammar(answer=structured, tool_format=body.tool_format), True


# ---- the other fields, by family ---------------------------------------------------------------------
def _processor_arguments(defaults: Defaults) -> dict[str, Any]:
    """Warpers and logits processors: request > model > server default."""
    resolve = defaults.resolve
    return {
        "top_k": resolve("top_k", None) or None,
        "top_p": float(resolve("top_p", 1.0)),
        "min_p": resolve("min_p", None),
        "typical_p": float(resolve("typical_p", 1.0)),
        "epsilon_cutoff": resolve("epsilon_cutoff", 0.0) or 0.0,
        "eta_cutoff": resolve("eta_cutoff", 0.0) or 0.0,
        "repetition_penalty": float(resolve("repetition_penalty", 1.0)),
        "no_repeat_ngram_size": resolve("no_repeat_ngram_size", 0) or 0,
        "bad_words_ids": resolve("bad_words_ids", None),
        "suppress_tokens": resolve("suppress_tokens", None),
    }


def _beam_arguments(body: GenerationFields, defaults: Defaults) -> dict[str, Any]:
    """Beam search: the request chooses it; the model's beam-only defaults apply once it has."""
    return {
        "num_beams": 1 if body.num_beams is None else body.num_beams,
        "num_beam_groups": 1 if body.num_beam_groups is None else body.num_beam_groups,
        "diversity_penalty": (
            defaults.resolve("diversity_penalty", 0.0) if (body.num_beam_groups or 1) > 1 else body.diversity_penalty
        )
        or 0.0,  # fmt: skip
        "length_penalty": float(defaults.resolve("length_penalty", 1.0)),
        "early_stopping": defaults.resolve("early_stopping", False),
        "num_return_sequences": body.num_return_sequences or 1,
    }


def _strategy_arguments(body: GenerationFields) -> dict[str, Any]:
    """The knobs that select a strategy: from the request alone (a model cannot switch an OpenAI client's).
    A ``prediction`` (OpenAI's Predicted Outputs) turns on prompt lookup decoding, which drafts from it."""
    prediction = body.prediction_text()
    lookup = body.prompt_lookup_num_tokens
    if prediction is not None:
        _check_prediction(body)
        lookup = PREDICTION_LOOKUP_TOKENS if lookup is None else lookup
    return {
        "prediction": prediction,
        "penalty_alpha": body.penalty_alpha,
        "dola_layers": body.dola_layers,
        "prompt_lookup_num_tokens": lookup,
        "max_matching_ngram_size": body.max_matching_ngram_size,
        "num_assistant_tokens": body.num_assistant_tokens,
        "num_assistant_tokens_schedule": body.num_assistant_tokens_schedule,
        "assistant_confidence_threshold": body.assistant_confidence_threshold,
        "assistant_early_exit": body.assistant_early_exit,
        "assistant_model": body.assistant_model,
    }


PREDICTION_LOOKUP_TOKENS = 10  # drafts per step when a prediction turns prompt lookup on (HF's usual)
PREDICTION_EXCLUDES = ("num_beams", "penalty_alpha", "dola_layers", "assistant_model", "assistant_early_exit",
                       "custom_generate")  # fmt: skip


def _check_prediction(body: GenerationFields) -> None:
    """A prediction drafts for speculative decoding (prompt lookup); another strategy cannot take drafts."""
    for name in PREDICTION_EXCLUDES:
        value = getattr(body, name)
        if value is not None and value != 1:
            raise ParameterError(f"prediction drafts for prompt lookup decoding; it cannot be combined with {name}",
                                 param="prediction")  # fmt: skip


def _output_arguments(
    body: GenerationFields, logprobs: int | None, prompt_logprobs: int | None, shows_special_tokens: bool
) -> dict[str, Any]:
    """OpenAI's fields: how many completions, where they stop, biases and penalties, what comes back.
    ``shows_special_tokens``: tools are offered, and a model whose call tags are special tokens must
    still show them to the parser."""
    n = aliases.requested(body, "num_return_sequences")
    return {
        "n": body.n if n is None else n,
        "seed": body.seed,
        "stop": [body.stop] if isinstance(body.stop, str) else list(body.stop or []),
        "stop_token_ids": list(body.stop_token_ids or []),
        "logit_bias": _logit_bias(body.logit_bias),
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "logprobs": logprobs,
        "prompt_logprobs": prompt_logprobs,
        "skip_special_tokens": body.skip_special_tokens and not shows_special_tokens,
        "generation_preset": body.generation_preset,
        "custom_generate": body.custom_generate,
    }


def _hf_knob_arguments(body: GenerationFields, defaults: Defaults) -> dict[str, Any]:
    """The newer GenerationConfig knobs in HF's JSON shapes: ``sequence_bias`` a list of
    ``[token_ids, bias]`` pairs, ``exponential_decay_length_penalty`` ``[start_index, decay_factor]``,
    ``stop_strings`` a string or a list; each falls back to the model's file when the request leaves it out."""
    stop_strings = defaults.resolve("stop_strings", None)
    sequence_bias = defaults.resolve("sequence_bias", None)
    decay = defaults.resolve("exponential_decay_length_penalty", None)
    return {
        "stop_strings": [stop_strings] if isinstance(stop_strings, str) else stop_strings,
        "sequence_bias": None if sequence_bias is None else [_pair(p) for p in sequence_bias],
        "exponential_decay_length_penalty": None if decay is None else _pair(decay, tuple),
        "begin_suppress_tokens": defaults.resolve("begin_suppress_tokens", None),
        "forced_bos_token_id": defaults.resolve("forced_bos_token_id", None),
        "forced_eos_token_id": defaults.resolve("forced_eos_token_id", None),
        "renormalize_logits": bool(defaults.resolve("renormalize_logits", False)),
        "max_length": max_length(body),
        "min_length": min_length(body, defaults),
        "token_healing": bool(body.token_healing),
    }


def _pair(value: Any, kind: type = list) -> Any:
    """``[a, number]`` with the number as a float; anything else as sent, for validate() to name."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[1], (int, float)):
        first = list(value[0]) if isinstance(value[0], (list, tuple)) else value[0]
        return kind([first, float(value[1])])
    return kind(value) if isinstance(value, (list, tuple)) else value


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        try:
            out[int(key)] = float(value)
        except ValueError:
            raise ParameterError(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias") from None
    return out
