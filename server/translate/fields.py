"""The generation fields every API's body shares: one strict pydantic table, OpenAI's names first.

This is what a client may send, not what it means: ``server.translate.params`` turns it into
``GenerationParams`` and each API's ``protocol`` module (``server.api.<name>.protocol``) adds its own
fields and says which of its texts are rendered or tokenized (``rendered_texts``), which lists are
bounded (``sized_lists``) and which tools it offers (``tool_use``), so the one translation and the
one size check serve every API. Presets (``server.translate.presets``) are checked against this same
table, so a preset file can only hold what a request could. Models forbid unknown fields (a typo like
``num_beam`` is a 400 naming it) and are strict about types; the one exception is a
``custom_generate`` request, whose other fields are the method's keyword arguments and are set aside
for ``decoding`` to check against its signature.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Sized
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    model_validator,
)

from decoding import ParameterError
from decoding.params.structured import StructuredOutput
from server.output.tool_formats import DEFAULT_FORMAT
from server.translate.strict import Strict
from server.translate.structured import ResponseFormat, StructuredOutputs, structured_output_of
from server.translate.tools import ToolUse
from server.translate.unserved import refused_when_true
from server.translate.watermark import WatermarkingConfigBody


class StreamOptions(Strict):
    include_usage: bool | None = False
    # OpenAI pads stream events against length side channels unless told not to; Decoda pads none (a hint)
    include_obfuscation: bool | None = None


# OpenAI's limits on metadata: 16 pairs, keys of at most 64 characters, string values of at most 512
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512


def _metadata_within_limits(value: Any) -> Any:  # noqa: ANN401
    """OpenAI's limits, said in words before the schema's own constraints would say them in pydantic's."""
    if not isinstance(value, dict):
        return value
    if len(value) > METADATA_PAIRS:
        raise ParameterError(f"metadata holds at most {METADATA_PAIRS} pairs, got {len(value)}", param="metadata")
    for key, item in value.items():
        if len(key) > METADATA_KEY_CHARS:
            raise ParameterError(f"metadata keys are at most {METADATA_KEY_CHARS} characters, got {key[:20]!r}... "
                                 f"({len(key)} characters)", param="metadata")  # fmt: skip
        if isinstance(item, str) and len(item) > METADATA_VALUE_CHARS:
            raise ParameterError(f"metadata values are at most {METADATA_VALUE_CHARS} characters; {key!r} has "
                                 f"{len(item)}", param="metadata")  # fmt: skip
    return value


Metadata = Annotated[
    dict[Annotated[str, Field(max_length=METADATA_KEY_CHARS)], Annotated[str, Field(max_length=METADATA_VALUE_CHARS)]],
    Field(max_length=METADATA_PAIRS),
    BeforeValidator(_metadata_within_limits),
]


PrewarmOnly = refused_when_true("prompt_cache_options.prewarm (filling the prompt cache without a reply)",
                               "every request here is answered; the prefix cache keeps a prompt's blocks from any "
                               "request that read them")  # fmt: skip


class PromptCacheOptions(Strict):
    """Hints: the prefix cache keeps every prompt's blocks unasked, until evicted (no lifetime is promised)."""

    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m", "12h"] | None = None
    comparison_response_id: str | None = None  # asks for cache diagnostics "when the feature is enabled": it is not
    prewarm: PrewarmOnly = None


class RequestHints(Strict):
    """OpenAI's fields about a request rather than its tokens (its Chat Completions and Responses APIs
    define them; legacy Completions does not): each is checked as OpenAI checks it and none changes
    what is generated, so a client that always sends them is served, and nothing it asked for is
    silently dropped: each says below why it has nothing to do here."""

    store: bool | None = None  # a no-op: Decoda keeps no completions (nothing to list, distil or evaluate later)
    metadata: Metadata | None = None  # tags for a stored completion: checked, and kept nowhere (see store)
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"] | None = None  # one tier
    prompt_cache_key: str | None = None  # a hint: the prefix cache matches a prompt's tokens, whoever sent them
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None  # a hint: cached blocks live until evicted
    prompt_cache_options: PromptCacheOptions | None = None  # a hint, as above
    safety_identifier: str | None = None  # like ``user``: an end user's id for OpenAI's abuse checks; unused


@functools.cache
def _null_is_default(model: type[BaseModel]) -> frozenset[str]:
    """The fields of ``model`` with a default other than null and a type without null (``n``, ``stream``,
    ``presence_penalty``, chat's ``logprobs``, completions' ``echo``...): OpenAI's and Anthropic's types make
    each optional, and a client that dumps its params sends them null, which means "not given"."""
    return frozenset(name for name, field in model.model_fields.items()
                     if not field.is_required() and field.default is not None and field.default_factory is None
                     and type(None) not in typing.get_args(field.annotation))  # fmt: skip


def _nullable_defaults(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """``/openapi.json`` says what the server takes: null beside the type of each field it reads as its default."""
    for name in _null_is_default(model):
        prop = schema.get("properties", {}).get(model.model_fields[name].alias or name)
        if prop is not None and "anyOf" not in prop:
            kept = {key: prop.pop(key) for key in ("title", "default", "description") if key in prop}
            inner = dict(prop)
            prop.clear()
            prop.update({"anyOf": [inner, {"type": "null"}], **kept})


class GenerationFields(Strict):
    """Fields shared by both endpoints: OpenAI's, then transformers' GenerationConfig names."""

    model_config = ConfigDict(json_schema_extra=_nullable_defaults)

    model: str | None = None  # optional: this server serves one target model
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # transformers GenerationConfig knobs
    do_sample: bool | None = None
    top_k: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    epsilon_cutoff: float | None = None
    eta_cutoff: float | None = None
    repetition_penalty: float | None = None
    no_repeat_ngram_size: int | None = None
    bad_words_ids: list[list[int]] | None = None
    suppress_tokens: list[int] | None = None
    min_new_tokens: int | None = None
    min_tokens: int | None = None  # vLLM's name for min_new_tokens
    max_new_tokens: int | None = None
    max_time: float | None = None
    num_beams: int | None = None
    num_beam_groups: int | None = None
    diversity_penalty: float | None = None
    length_penalty: float | None = None
    early_stopping: bool | Literal["never"] | None = None
    num_return_sequences: int | None = None
    penalty_alpha: float | None = None
    dola_layers: Literal["low", "high"] | list[int] | None = None
    prompt_lookup_num_tokens: int | None = None
    max_matching_ngram_size: int | None = None
    num_assistant_tokens: int | None = None
    num_assistant_tokens_schedule: str | None = None
    assistant_confidence_threshold: float | None = None
    assistant_early_exit: int | None = None
    # serving extensions
    assistant_model: str | None = None
    generation_preset: str | None = None
    custom_generate: str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    # vLLM's: lower runs first (needs --scheduling-policy priority; server.translate.scheduling)
    priority: int = Field(0, description="vLLM's scheduling priority: lower runs first, and running requests of a "
                          "higher number give way to it; 0 by default; with --scheduling-policy fcfs (the default) "
                          "only 0 is served (400 otherwise)")  # fmt: skip
    return_token_ids: bool = False
    skip_special_tokens: bool = True
    stop_strings: str | list[str] | None = None  # HF's: kept in the output (OpenAI's stop trims)
    # pairs as JSON arrays (strict models refuse arrays for tuples); their shape is checked in validate()
    sequence_bias: list[list[list[int] | float]] | None = None  # [[token_ids, bias], ...]
    exponential_decay_length_penalty: list[int | float] | None = None  # [start_index, decay_factor]
    begin_suppress_tokens: list[int] | None = None
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | list[int] | None = None
    renormalize_logits: bool | None = None
    max_length: int | None = None  # prompt + generated; max_tokens / max_new_tokens win when both are given
    min_length: int | None = None  # prompt + generated; min_new_tokens / min_tokens win when both are given
    token_healing: bool | None = None
    watermarking_config: WatermarkingConfigBody | None = None  # default: the server's --watermark
    guidance_scale: float | None = None
    negative_prompt: str | None = None
    negative_prompt_ids: list[int] | None = None
    # structured outputs: OpenAI's response_format, vLLM's structured_outputs (server.translate.structured)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    # with custom_generate, the body's other fields are the method's keyword arguments (checked against
    # its signature in decoding.validation); without it they stay unknown fields (400 naming the first)
    _custom_generate_args: dict[str, Any] = PrivateAttr(default_factory=dict)
    # how the served model writes tool calls (--tool-call-parser), which the call grammar follows: the
    # server's, not the client's, so set by the generation path (``with_tool_format``), never sent
    _tool_format: str = PrivateAttr(default=DEFAULT_FORMAT)

    @model_validator(mode="wrap")
    @classmethod
    def _split_custom_generate_args(cls, data: Any, handler: ModelWrapValidatorHandler) -> Any:
        if isinstance(data, dict):  # null stands for the default (the SDKs' types make these optional)
            data = {k: v for k, v in data.items() if v is not None or k not in _null_is_default(cls)}
        extra: dict[str, Any] = {}
        if isinstance(data, dict) and data.get("custom_generate") is not None:
            extra = {k: v for k, v in data.items() if k not in cls.model_fields}
            data = {k: v for k, v in data.items() if k in cls.model_fields}
        model = handler(data)
        if extra:
            model._custom_generate_args = extra
        return model

    @property
    def custom_generate_args(self) -> dict[str, Any]:
        """The body's fields beyond this table when it names a ``custom_generate`` method (else empty)."""
        return self._custom_generate_args

    @property
    def tool_format(self) -> str:
        return self._tool_format

    def with_tool_format(self, name: str) -> Self:
        """This body, its tool calls constrained to the format ``name`` (``server.output.tool_formats``)."""
        body = self.model_copy()
        body._tool_format = name
        return body

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    # ---- what each API's body adds (its protocol module overrides these) -----------------------------
    def rendered_texts(self) -> dict[str, list[str]]:
        """Every text the server will render or tokenize, by the field an error names: each one is
        checked against the context before any template or tokenizer runs (``server.translate.sizes``)."""
        return {"negative_prompt": [self.negative_prompt]} if self.negative_prompt is not None else {}

    def sized_lists(self) -> dict[str, Sized | None]:
        """The body's own lists with an entry in ``SIZE_LIMITS`` (the knobs' lists are the params')."""
        return {}

    def tool_use(self) -> ToolUse | None:
        """The tools this body offers the model, in OpenAI's function shape (None: it offers none)."""
        return None

    def end_user(self) -> str | None:
        """The end user the body names (OpenAI's ``safety_identifier``, else ``user``): on a server without
        API keys, the caller whose fair share the request counts in (``server.translate.scheduling``)."""
        return getattr(self, "safety_identifier", None) or self.user

    def prediction_text(self) -> str | None:
        """OpenAI's Predicted Outputs: text the reply is expected to repeat (None: none given)."""
        return None

    def structured_output(self) -> StructuredOutput | None:
        """The one shape the body constrains its reply to (None: free text)."""
        return structured_output_of(self.response_format, self.structured_outputs)
