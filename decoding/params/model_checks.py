"""Checks a request can only fail against the served model: its vocabulary, depth, context and batch.

``params.validate`` already checked every knob on its own; what is left needs facts about the
model and the server (vocabulary size, layer count, ``max_model_len``, ``--max-num-seqs``,
``--max-num-beams``, the preloaded assistants). They live in one small ``ModelFacts`` so the
engine client, the fake engine of the HTTP tests and anything else check a request the same way,
in one place, before it reaches the worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from decoding.params.custom_methods import CustomMethodInfo, check_custom_method
from decoding.params.errors import ParameterError
from decoding.params.generation import GenerationParams, guidance_active
from decoding.params.knobs import check_knob_ids, check_max_length
from decoding.params.lengths import new_token_limit
from decoding.params.seq2seq_checks import check_seq2seq_request
from decoding.params.thinking import thinking_ids


@dataclass(frozen=True)
class ModelFacts:
    """What validation needs to know about the served model and the server's limits."""

    vocab_size: int
    max_model_len: int  # prompt plus generated tokens
    num_layers: int | None = None  # decoder layers; None skips the layer checks
    max_num_seqs: int = 16  # rows (KV slots) in the batch: one request's n or num_beams must fit
    max_num_beams: int = 8  # --max-num-beams
    assistants: tuple[str, ...] = ()  # names of the preloaded draft models
    custom_methods: tuple[CustomMethodInfo, ...] = ()  # --custom-generate methods
    bos_token_id: int | None = None  # the detector drops a leading BOS, as HF's WatermarkDetector
    # the longest text one token stands for (its vocabulary entry's length bounds it): a text longer
    # than max_model_len of those cannot fit the context, whatever it tokenizes to; None: unknown
    max_chars_per_token: int | None = None
    # an encoder-decoder model: the prompt is the encoder's (at most ``max_encoder_len`` tokens) and the
    # decoder's own prompt, ``decoder_prompt_len`` tokens, counts in ``max_model_len`` with the completion
    encoder_decoder: bool = False
    input_kind: str = "text"  # what the model's encoder reads: "text", or "audio" (Whisper: the audio API)
    max_encoder_len: int | None = None
    decoder_prompt_len: int = 1
    takes_images: bool = False  # a vision-language model: chat, Responses and Messages take image parts


def check_against_model(
    params: GenerationParams,
    facts: ModelFacts,
    prompts: Sequence[Sequence[int]],
    prompt_param: str = "prompt",
) -> None:
    """Raise ``ParameterError`` naming the field if the model or server cannot serve ``params``.

    ``prompts`` are the token ids of every prompt the request submits with ``params``;
    ``prompt_param`` is the field they came from (``prompt`` or ``messages``), which the context
    error names, as OpenAI does.
    """
    if prompt_param in ("prompt", "messages", "input"):
        check_takes_text(facts)
    for ids in prompts:
        if not ids:  # e.g. text the tokenizer drops whole ("\r" for a word-level one): nothing to continue
            raise ParameterError(f"the {prompt_param} has no tokens once tokenized", param=prompt_param,
                                 code="empty_prompt")  # fmt: skip
        _check_ids(ids, facts.vocab_size, prompt_param, prompt=True)
    _check_ids((t for words in params.bad_words_ids or [] for t in words), facts.vocab_size, "bad_words_ids")
    _check_ids(params.suppress_tokens or [], facts.vocab_size, "suppress_tokens")
    _check_ids(params.logit_bias or {}, facts.vocab_size, "logit_bias")
    _check_ids(params.stop_token_ids, facts.vocab_size, "stop_token_ids")
    _check_ids(thinking_ids(params), facts.vocab_size, "thinking")
    check_knob_ids(params, facts.vocab_size)
    _check_layers(params, facts.num_layers)
    _check_rows(params, facts)
    check_custom_method(params, {method.name: method for method in facts.custom_methods})
    if params.assistant_model is not None and params.assistant_model not in facts.assistants:
        raise ParameterError(
            f"unknown assistant_model '{params.assistant_model}'; served assistants: "
            f"{sorted(facts.assistants) or 'none'}",
            param="assistant_model",
            code="model_not_found",
        )
    for ids in prompts:
        if facts.encoder_decoder:
            check_seq2seq_request(params, len(ids), facts.max_encoder_len)
            ids = ids[: facts.decoder_prompt_len]  # the decoder's context holds its prompt, not the encoder's
        # max_length counts generate()'s input_ids: GIT's image positions (``ImagePrompt.text_start``) are not in them
        text = len(ids) - getattr(getattr(ids, "media", None), "text_start", 0)
        check_max_length(params, text, prompt_param)
        check_context(len(ids), new_token_limit(params, text), facts.max_model_len, prompt_param)
    if params.prediction_ids is not None:  # drafts are looked up in it: ids of this vocabulary, at most a context
        _check_ids(params.prediction_ids, facts.vocab_size, "prediction")
        if len(params.prediction_ids) > facts.max_model_len:
            raise ParameterError(f"prediction has {len(params.prediction_ids)} tokens; at most {facts.max_model_len} "
                                 "(the model's context)", param="prediction", code="too_long")  # fmt: skip
    if params.negative_prompt_ids is not None:  # the unconditional row holds it plus the output
        _check_ids(params.negative_prompt_ids, facts.vocab_size, "negative_prompt_ids")
        negative = len(params.negative_prompt_ids)
        generated = max((new_token_limit(params, len(ids)) for ids in prompts), default=params.max_new_tokens)
        check_context(negative, generated, facts.max_model_len, "negative_prompt_ids")
    if guidance_active(params) and 2 * params.n > facts.max_num_seqs:  # a twin row per returned row
        raise ParameterError(
            f"n ({params.n}) with guidance_scale needs {2 * params.n} rows (each with its unconditional row), "
            f"more than the server's batch holds (--max-num-seqs {facts.max_num_seqs})",
            param="n",
        )


def check_text_size(num_chars: int, facts: ModelFacts, param: str) -> None:
    """Refuse, before any tokenizer or template work, a text that cannot fit the context: past
    ``max_model_len * max_chars_per_token`` characters no tokenization makes it short enough."""
    if facts.max_chars_per_token is None:
        return
    limit = facts.max_model_len * facts.max_chars_per_token
    if num_chars > limit:
        raise ParameterError(
            f"This model's maximum context length is {facts.max_model_len} tokens; the {param} has {num_chars} "
            f"characters, more than any {facts.max_model_len} tokens can spell ({limit}). Please reduce the "
            f"length of the {param}.",
            param=param,
            code="context_length_exceeded",
        )


def check_takes_text(facts: ModelFacts) -> None:
    """A speech model's encoder reads audio: text prompts are a 400 naming ``model``."""
    if facts.input_kind == "audio":
        raise ParameterError("this model transcribes speech: send audio to /v1/audio/transcriptions or "
                             "/v1/audio/translations", param="model", code="model_not_supported")  # fmt: skip


def check_context(prompt_len: int, max_tokens: int, limit: int, param: str) -> None:
    """OpenAI's ``context_length_exceeded``, worded as OpenAI words it."""
    if prompt_len + max_tokens > limit:
        raise ParameterError(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the {param}, {max_tokens} for the completion). "
            f"Please reduce the length of the {param} or max_tokens.",
            param=param,
            code="context_length_exceeded",
        )


def _check_ids(ids: Iterable[int], vocab_size: int, param: str, *, prompt: bool = False) -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if not bad:
        return
    if prompt:
        raise ParameterError(f"prompt token ids must be in [0, {vocab_size}), got {bad[:5]}", param=param)
    raise ParameterError(f"{param} contains token id {bad[0]}, outside the vocabulary [0, {vocab_size})", param=param)


def _check_layers(params: GenerationParams, num_layers: int | None) -> None:
    if num_layers is None:
        return
    if isinstance(params.dola_layers, list):
        for layer in params.dola_layers:
            if not 0 <= layer <= num_layers:
                raise ParameterError(
                    f"dola_layers entries must be in [0, {num_layers}] for this model, got {layer}",
                    param="dola_layers",
                )
        if not any(layer < num_layers for layer in params.dola_layers):
            raise ParameterError(
                f"dola_layers needs at least one premature layer below {num_layers} (the final layer)",
                param="dola_layers",
            )
    exit_layer = params.assistant_early_exit
    if exit_layer is not None and not 1 <= exit_layer <= num_layers - 1:
        raise ParameterError(
            f"assistant_early_exit must be in [1, {num_layers - 1}] for this model, got {exit_layer}",
            param="assistant_early_exit",
        )


def _check_rows(params: GenerationParams, facts: ModelFacts) -> None:
    if params.num_beams > facts.max_num_beams:
        raise ParameterError(
            f"num_beams must be at most {facts.max_num_beams} on this server (--max-num-beams), got {params.num_beams}",
            param="num_beams",
        )
    rows, field_name = (params.num_beams, "num_beams") if params.num_beams > 1 else (params.n, "n")
    if rows > facts.max_num_seqs:
        raise ParameterError(
            f"{field_name} ({rows}) needs more rows than the server's batch holds (--max-num-seqs "
            f"{facts.max_num_seqs})",
            param=field_name,
        )
