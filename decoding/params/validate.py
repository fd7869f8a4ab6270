"""A request's one validation: every knob and every combination, checked once before the worker.

Messages name the field, the allowed range and the value. Incompatible combinations are errors:
nothing a user sets is silently ignored. Each strategy family has its own rule function; the
knob-level checks of the newer GenerationConfig fields, watermarking and custom methods live in
their own modules and are called from here. What also depends on the served model (its
vocabulary, layers, context, the server's batch) is ``decoding.params.model_checks``.
"""

from __future__ import annotations

from decoding.params.bounds import MAX_CONTRASTIVE_TOP_K, SIMPLE_BOUNDED, in_range
from decoding.params.custom_methods import validate_custom
from decoding.params.errors import require
from decoding.params.generation import GenerationParams, Strategy, guidance_active, is_assisted, resolve_strategy
from decoding.params.knobs import validate_knobs
from decoding.params.sizes import check_sizes
from decoding.params.thinking import validate_thinking


def validate(params: GenerationParams) -> None:
    """Complete validation of one request's knobs, once, before it reaches the worker.

    Messages name the field, the allowed range and the value. Incompatible combinations are
    errors: nothing a user sets is silently ignored. What also depends on the served model (its
    vocabulary, layers, context, the server's batch) is ``decoding.params.model_checks.check_against_model``.
    """
    check_sizes(params)  # first: no check below walks an unbounded list
    in_range(params, "max_tokens", params.max_new_tokens)
    in_range(params, "min_tokens", params.min_new_tokens)
    require(
        params.min_new_tokens <= params.max_new_tokens or params.max_length is not None,  # that: below
        "min_tokens",
        f"min_tokens ({params.min_new_tokens}) must not exceed max_tokens ({params.max_new_tokens})",
    )
    in_range(params, "temperature")
    require(
        not (params.do_sample and params.temperature == 0),
        "temperature",
        "temperature 0 means greedy decoding; it cannot be combined with do_sample=true",
    )
    for name in SIMPLE_BOUNDED:
        in_range(params, name)
    for token, bias in (params.logit_bias or {}).items():
        in_range(params, "logit_bias", bias, shown=f"logit_bias[{token}]")
    for words in params.bad_words_ids or []:
        require(bool(words), "bad_words_ids", "bad_words_ids must not contain an empty list")
    require(all(s for s in params.stop), "stop", "stop strings must not be empty")
    in_range(params, "seed")
    _validate_beams(params)
    _validate_contrastive(params)
    _validate_dola(params)
    _validate_assisted(params)
    validate_knobs(params)
    if params.watermarking_config is not None:
        params.watermarking_config.validate()
    _validate_guidance(params)
    _validate_structured(params)
    validate_thinking(params)
    validate_custom(params)
    require(params.priority == 0 or params.custom_generate is None, "priority",
            "a custom_generate method runs as an exclusive job between the batch's steps, in arrival order, outside "
            f"the scheduler's priorities; priority must be 0 with it, got {params.priority}")  # fmt: skip


def _validate_beams(params: GenerationParams) -> None:
    """The server's own cap on num_beams (--max-num-beams) is in ``decoding.params.model_checks``."""
    in_range(params, "num_beams")
    in_range(params, "num_beam_groups")
    require(
        params.num_beams % params.num_beam_groups == 0,
        "num_beam_groups",
        f"num_beams ({params.num_beams}) must be divisible by num_beam_groups ({params.num_beam_groups})",
    )
    require(
        params.diversity_penalty == 0 or params.num_beam_groups > 1,
        "diversity_penalty",
        "diversity_penalty requires num_beam_groups > 1",
    )
    require(
        not (params.do_sample and params.num_beam_groups > 1),
        "num_beam_groups",
        "diverse beam search (num_beam_groups > 1) cannot be combined with do_sample",
    )
    require(
        params.num_return_sequences <= params.num_beams or params.num_beams == 1,
        "num_return_sequences",
        f"num_return_sequences ({params.num_return_sequences}) must not exceed num_beams ({params.num_beams})",
    )
    require(
        params.early_stopping in (True, False, "never"),
        "early_stopping",
        f'early_stopping must be true, false or "never", got {params.early_stopping!r}',
    )
    if params.num_beams > 1:
        require(params.n <= params.num_beams, "n", f"n ({params.n}) must not exceed num_beams ({params.num_beams})")


def _validate_contrastive(params: GenerationParams) -> None:
    in_range(params, "penalty_alpha")
    if params.penalty_alpha and resolve_strategy(params) not in (Strategy.CONTRASTIVE, Strategy.ASSISTED):
        require(
            params.dola_layers is not None,  # that combination has its own message below
            "penalty_alpha",
            "penalty_alpha (contrastive search) needs top_k > 1, num_beams 1 and no sampling "
            "(temperature 0 or do_sample false)",
        )
    if resolve_strategy(params) is Strategy.CONTRASTIVE:
        require(
            params.top_k <= MAX_CONTRASTIVE_TOP_K,
            "top_k",
            f"top_k for contrastive search must be at most {MAX_CONTRASTIVE_TOP_K}, got {params.top_k}",
        )


def _validate_dola(params: GenerationParams) -> None:
    dola = params.dola_layers
    if dola is not None:
        require(
            dola in ("low", "high") or (isinstance(dola, list) and all(isinstance(i, int) for i in dola)),
            "dola_layers",
            f'dola_layers must be "low", "high" or a list of layer indices, got {dola!r}',
        )
        require(params.num_beams == 1, "dola_layers", "dola_layers cannot be combined with num_beams > 1")
        require(params.penalty_alpha is None, "dola_layers", "dola_layers cannot be combined with penalty_alpha")


def _validate_assisted(params: GenerationParams) -> None:
    if is_assisted(params):
        require(params.num_beams == 1, "num_beams", "assisted decoding cannot be combined with num_beams > 1")
        require(
            params.penalty_alpha is None, "penalty_alpha", "assisted decoding cannot be combined with penalty_alpha"
        )
        require(params.dola_layers is None, "dola_layers", "assisted decoding cannot be combined with dola_layers")
    for name in ("prompt_lookup_num_tokens", "assistant_early_exit", "num_assistant_tokens", "max_matching_ngram_size"):
        in_range(params, name)
    schedule = params.num_assistant_tokens_schedule
    require(
        schedule in (None, "constant", "heuristic", "heuristic_transient"),
        "num_assistant_tokens_schedule",
        f"num_assistant_tokens_schedule must be constant, heuristic or heuristic_transient, got {schedule!r}",
    )
    in_range(params, "assistant_confidence_threshold")
    model_drafts = params.assistant_model is not None or params.assistant_early_exit is not None
    for name in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold"):
        require(
            getattr(params, name) is None or model_drafts,
            name,
            f"{name} applies to draft models (assistant_model) and early exit (assistant_early_exit)",
        )
    require(
        params.max_matching_ngram_size is None or params.prompt_lookup_num_tokens is not None,
        "max_matching_ngram_size",
        "max_matching_ngram_size applies to prompt lookup (prompt_lookup_num_tokens)",
    )
    require(
        (params.prediction is None and params.prediction_ids is None) or params.prompt_lookup_num_tokens is not None,
        "prediction",
        "prediction drafts for prompt lookup decoding (prompt_lookup_num_tokens)",
    )


def _validate_guidance(params: GenerationParams) -> None:
    """Classifier-free guidance: its scale, its negative prompt, the strategies it rides on."""
    in_range(params, "guidance_scale")
    require(
        params.negative_prompt is None or params.negative_prompt_ids is None,
        "negative_prompt",
        "give negative_prompt (text) or negative_prompt_ids (token ids), not both",
    )
    for name in ("negative_prompt", "negative_prompt_ids"):
        value = getattr(params, name)
        if value is None:
            continue
        require(len(value) > 0, name, f"{name} must not be empty")
        require(
            guidance_active(params),
            name,
            f"{name} is the unconditional prompt of classifier-free guidance: it needs guidance_scale other than 1, "
            f"got {params.guidance_scale}",
        )
    if guidance_active(params):
        require(
            params.custom_generate is None,
            "guidance_scale",
            "guidance_scale cannot be combined with custom_generate (the method decodes by itself)",
        )
        strategy = resolve_strategy(params)
        require(
            strategy in (Strategy.GREEDY, Strategy.SAMPLE),
            "guidance_scale",
            f"guidance_scale (classifier-free guidance) combines with greedy search and sampling only, "
            f"not with {strategy.value} decoding",
        )


def _validate_structured(params: GenerationParams) -> None:
    """A constraint holds under every strategy; a custom method decodes by itself, so it cannot."""
    if params.structured_output is None:
        return
    params.structured_output.validate()
    require(
        params.custom_generate is None,
        params.structured_output.param,
        f"{params.structured_output.param} cannot be combined with custom_generate: the method "
        f"'{params.custom_generate}' decodes by itself, outside the constrained sampler",
    )
