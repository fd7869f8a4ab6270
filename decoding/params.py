"""Every knob of one generation request, validated once at the edge.

Field names mirror ``transformers.GenerationConfig`` exactly so a user's HF knowledge carries over;
serving fields (seed, stop, logit_bias, OpenAI penalties, logprobs, ...) sit beside them. This module
never imports torch: the HTTP layer builds and validates these objects before anything reaches the
worker, and the worker trusts them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from decoding.watermark_config import WatermarkingConfig


class Strategy(str, Enum):
    """The decoding method HF's ``generate()`` would pick for the same knobs."""

    GREEDY = "greedy"
    SAMPLE = "sample"
    BEAM = "beam"
    BEAM_SAMPLE = "beam_sample"
    GROUP_BEAM = "group_beam"
    CONTRASTIVE = "contrastive"
    DOLA = "dola"
    ASSISTED = "assisted"


class ParameterError(ValueError):
    """A request knob is wrong; ``param`` names the field exactly as the user sent it."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_parameter") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


@dataclass
class GenerationParams:
    # --- length -------------------------------------------------------------------------------
    max_new_tokens: int = 16
    min_new_tokens: int = 0
    ignore_eos: bool = False
    max_time: float | None = None
    # --- sampling / logits knobs (HF names) -------------------------------------------------------
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    min_p: float | None = None
    typical_p: float = 1.0
    epsilon_cutoff: float = 0.0
    eta_cutoff: float = 0.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    bad_words_ids: list[list[int]] | None = None
    suppress_tokens: list[int] | None = None
    # --- beam family (issue: beam search) --------------------------------------------------------
    num_beams: int = 1
    num_beam_groups: int = 1
    diversity_penalty: float = 0.0
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    num_return_sequences: int = 1
    # --- contrastive / DoLa ---------------------------------------------------------------------
    penalty_alpha: float | None = None
    dola_layers: str | list[int] | None = None
    # --- speculative family -------------------------------------------------------------------------
    prompt_lookup_num_tokens: int | None = None
    max_matching_ngram_size: int | None = None
    num_assistant_tokens: int | None = None
    num_assistant_tokens_schedule: str | None = None
    assistant_confidence_threshold: float | None = None
    assistant_early_exit: int | None = None
    assistant_model: str | None = None
    # --- serving fields (OpenAI / vLLM meaning) -------------------------------------------------------
    n: int = 1
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    logit_bias: dict[int, float] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None  # None: no logprobs; k >= 0: the sampled token plus k alternatives
    prompt_logprobs: int | None = None  # echo + logprobs on completions
    skip_special_tokens: bool = True
    generation_preset: str | None = None
    custom_generate: str | None = None
    # --- more GenerationConfig knobs (issue 11) ---
    stop_strings: list[str] | None = None  # HF StopStringCriteria: the text is kept (OpenAI's stop trims)
    sequence_bias: list[tuple[list[int], float]] | None = None  # [[token_ids, bias], ...] as HF serialises it
    exponential_decay_length_penalty: tuple[int, float] | None = None  # (start_index, decay_factor)
    begin_suppress_tokens: list[int] | None = None
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | list[int] | None = None
    renormalize_logits: bool = False
    max_length: int | None = None  # prompt + generated; server/ keeps it only when max_new_tokens is not given
    min_length: int = 0  # prompt + generated; server/ keeps it only when min_new_tokens is not given
    token_healing: bool = False
    # --- watermarking (issue 11) ---
    watermarking_config: WatermarkingConfig | None = None  # HF's (decoding/watermark_config.py)
    # --- classifier-free guidance (issue 11) ---
    guidance_scale: float | None = None  # HF: CFG is on when set and not 1 (strategies/guidance.py)
    negative_prompt_ids: list[int] | None = None  # the unconditional branch's prompt (default: prompt's last token)
    negative_prompt: str | None = None  # text the server tokenizes into negative_prompt_ids before submitting
    # --- custom decoding methods (issue 11) ---
    # a request's extra fields, the method's keyword arguments (server/protocol.py collects them)
    custom_generate_args: dict[str, object] | None = None

    @property
    def strategy(self) -> Strategy:
        return resolve_strategy(self)

    def replace(self, **changes: object) -> GenerationParams:
        return dataclasses.replace(self, **changes)


def resolve_strategy(params: GenerationParams) -> Strategy:
    """HF's ``GenerationConfig.get_generation_mode`` rules, in its order of precedence."""
    if (
        params.assistant_model is not None
        or params.prompt_lookup_num_tokens is not None
        or params.assistant_early_exit is not None
    ):
        return Strategy.ASSISTED
    if params.dola_layers is not None:
        return Strategy.DOLA
    if params.num_beams > 1:
        if params.num_beam_groups > 1:
            return Strategy.GROUP_BEAM
        return Strategy.BEAM_SAMPLE if params.do_sample else Strategy.BEAM
    if (
        params.penalty_alpha is not None
        and params.penalty_alpha > 0
        and params.top_k is not None
        and params.top_k > 1
        and not params.do_sample
    ):
        return Strategy.CONTRASTIVE
    return Strategy.SAMPLE if params.do_sample else Strategy.GREEDY


MAX_CONTRASTIVE_TOP_K = 32  # the KV pool's scratch positions for candidates (strategies/contrastive.py)


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise ParameterError(message, param=param)


@dataclass(frozen=True)
class Bounds:
    """The values a numeric knob admits; ``validate`` enforces them and ``/openapi.json`` states them."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def admits(self, value: float) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def describe(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        left, right = ("(" if self.low_open else "["), (")" if self.high_open else "]")
        return f"in {left}{self.low:g}, {self.high:g}{right}"

    def json_schema(self) -> dict[str, float]:
        """JSON Schema (OpenAPI 3.1) keywords for these bounds."""
        out: dict[str, float] = {}
        if self.low is not None:
            out["exclusiveMinimum" if self.low_open else "minimum"] = self.low
        if self.high is not None:
            out["exclusiveMaximum" if self.high_open else "maximum"] = self.high
        return out


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
}


# checked as they are; the others under their HF name or inside a strategy's checks
SIMPLE_BOUNDED = ("top_p", "top_k", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "repetition_penalty",
                  "presence_penalty", "frequency_penalty", "no_repeat_ngram_size", "n", "logprobs", "max_time",
                  "length_penalty")


def _in_range(params: GenerationParams, name: str, value: float | None = None, shown: str | None = None) -> None:
    value = getattr(params, name) if value is None else value
    if value is None:
        return
    _check(BOUNDS[name].admits(value), name, f"{shown or name} must be {BOUNDS[name].describe()}, got {value}")


def validate(params: GenerationParams) -> None:
    """Complete validation of one request's knobs, once, before it reaches the worker.

    Messages name the field, the allowed range and the value. Incompatible combinations are
    errors: nothing a user sets is silently ignored. What also depends on the served model (its
    vocabulary, layers, context, the server's batch) is ``decoding.validation.check_against_model``.
    """
    _in_range(params, "max_tokens", params.max_new_tokens)
    _in_range(params, "min_tokens", params.min_new_tokens)
    _check(
        params.min_new_tokens <= params.max_new_tokens or params.max_length is not None,  # that: below
        "min_tokens",
        f"min_tokens ({params.min_new_tokens}) must not exceed max_tokens ({params.max_new_tokens})",
    )
    _in_range(params, "temperature")
    _check(
        not (params.do_sample and params.temperature == 0),
        "temperature",
        "temperature 0 means greedy decoding; it cannot be combined with do_sample=true",
    )
    for name in SIMPLE_BOUNDED:
        _in_range(params, name)
    for token, bias in (params.logit_bias or {}).items():
        _in_range(params, "logit_bias", bias, shown=f"logit_bias[{token}]")
    for words in params.bad_words_ids or []:
        _check(bool(words), "bad_words_ids", "bad_words_ids must not contain an empty list")
    _check(all(s for s in params.stop), "stop", "stop strings must not be empty")
    _validate_beams(params)
    _validate_special_strategies(params)
    from decoding.generation_knobs import validate_knobs  # late: that module imports this one

    validate_knobs(params)
    if params.watermarking_config is not None:
        params.watermarking_config.validate()
    _validate_guidance(params)
    from decoding.custom_methods import validate_custom  # (imports this module)

    validate_custom(params)


def _validate_beams(params: GenerationParams) -> None:
    """The server's own cap on num_beams (--max-num-beams) is in ``decoding.validation``."""
    _in_range(params, "num_beams")
    _in_range(params, "num_beam_groups")
    _check(
        params.num_beams % params.num_beam_groups == 0,
        "num_beam_groups",
        f"num_beams ({params.num_beams}) must be divisible by num_beam_groups ({params.num_beam_groups})",
    )
    _check(
        params.diversity_penalty == 0 or params.num_beam_groups > 1,
        "diversity_penalty",
        "diversity_penalty requires num_beam_groups > 1",
    )
    _check(
        not (params.do_sample and params.num_beam_groups > 1),
        "num_beam_groups",
        "diverse beam search (num_beam_groups > 1) cannot be combined with do_sample",
    )
    _check(
        params.num_return_sequences <= params.num_beams or params.num_beams == 1,
        "num_return_sequences",
        f"num_return_sequences ({params.num_return_sequences}) must not exceed num_beams ({params.num_beams})",
    )
    _check(
        params.early_stopping in (True, False, "never"),
        "early_stopping",
        f'early_stopping must be true, false or "never", got {params.early_stopping!r}',
    )
    if params.num_beams > 1:
        _check(params.n <= params.num_beams, "n", f"n ({params.n}) must not exceed num_beams ({params.num_beams})")


def _validate_special_strategies(params: GenerationParams) -> None:
    _in_range(params, "penalty_alpha")
    if params.penalty_alpha and resolve_strategy(params) not in (Strategy.CONTRASTIVE, Strategy.ASSISTED):
        _check(
            params.dola_layers is not None,  # that combination has its own message below
            "penalty_alpha",
            "penalty_alpha (contrastive search) needs top_k > 1, num_beams 1 and no sampling "
            "(temperature 0 or do_sample false)",
        )
    if resolve_strategy(params) is Strategy.CONTRASTIVE:
        _check(
            params.top_k <= MAX_CONTRASTIVE_TOP_K,
            "top_k",
            f"top_k for contrastive search must be at most {MAX_CONTRASTIVE_TOP_K}, got {params.top_k}",
        )
    dola = params.dola_layers
    if dola is not None:
        _check(
            dola in ("low", "high") or (isinstance(dola, list) and all(isinstance(i, int) for i in dola)),
            "dola_layers",
            f'dola_layers must be "low", "high" or a list of layer indices, got {dola!r}',
        )
        _check(params.num_beams == 1, "dola_layers", "dola_layers cannot be combined with num_beams > 1")
        _check(params.penalty_alpha is None, "dola_layers", "dola_layers cannot be combined with penalty_alpha")
    assisted = params.assistant_model is not None or params.prompt_lookup_num_tokens is not None
    assisted = assisted or params.assistant_early_exit is not None
    if assisted:
        _check(params.num_beams == 1, "num_beams", "assisted decoding cannot be combined with num_beams > 1")
        _check(params.penalty_alpha is None, "penalty_alpha", "assisted decoding cannot be combined with penalty_alpha")
        _check(dola is None, "dola_layers", "assisted decoding cannot be combined with dola_layers")
    for name in ("prompt_lookup_num_tokens", "assistant_early_exit", "num_assistant_tokens", "max_matching_ngram_size"):
        _in_range(params, name)
    schedule = params.num_assistant_tokens_schedule
    _check(
        schedule in (None, "constant", "heuristic", "heuristic_transient"),
        "num_assistant_tokens_schedule",
        f"num_assistant_tokens_schedule must be constant, heuristic or heuristic_transient, got {schedule!r}",
    )
    _in_range(params, "assistant_confidence_threshold")
    model_drafts = params.assistant_model is not None or params.assistant_early_exit is not None
    for name in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold"):
        _check(
            getattr(params, name) is None or model_drafts,
            name,
            f"{name} applies to draft models (assistant_model) and early exit (assistant_early_exit)",
        )
    _check(
        params.max_matching_ngram_size is None or params.prompt_lookup_num_tokens is not None,
        "max_matching_ngram_size",
        "max_matching_ngram_size applies to prompt lookup (prompt_lookup_num_tokens)",
    )


def guidance_active(params: GenerationParams) -> bool:
    """HF adds its CFG processor only for a guidance_scale other than 1 (at 1 it is the identity)."""
    return params.guidance_scale is not None and params.guidance_scale != 1


def _validate_guidance(params: GenerationParams) -> None:
    """Classifier-free guidance: its scale, its negative prompt, the strategies it rides on."""
    _in_range(params, "guidance_scale")
    _check(
        params.negative_prompt is None or params.negative_prompt_ids is None,
        "negative_prompt",
        "give negative_prompt (text) or negative_prompt_ids (token ids), not both",
    )
    for name in ("negative_prompt", "negative_prompt_ids"):
        value = getattr(params, name)
        if value is None:
            continue
        _check(len(value) > 0, name, f"{name} must not be empty")
        _check(
            guidance_active(params),
            name,
            f"{name} is the unconditional prompt of classifier-free guidance: it needs guidance_scale other than 1, "
            f"got {params.guidance_scale}",
        )
    if guidance_active(params):
        _check(
            params.custom_generate is None,
            "guidance_scale",
            "guidance_scale cannot be combined with custom_generate (the method decodes by itself)",
        )
        strategy = resolve_strategy(params)
        _check(
            strategy in (Strategy.GREEDY, Strategy.SAMPLE),
            "guidance_scale",
            f"guidance_scale (classifier-free guidance) combines with greedy search and sampling only, "
            f"not with {strategy.value} decoding",
        )
