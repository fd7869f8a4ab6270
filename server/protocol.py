"""OpenAI request bodies plus every GenerationConfig knob by its HF name, and their translation.

Models forbid unknown fields (a typo like ``num_beam`` is a 400 naming it) and are strict about
types. ``to_params`` applies OpenAI's meaning (temperature 0 is greedy, ``n``, ``stop``,
``logprobs``) and the default precedence request > model generation_config > server default,
then ``decoding.params.validate`` checks every knob once. What stays here are the checks that
only make sense on the request as sent: aliases that disagree (``n`` / ``num_return_sequences``),
a warper set on a greedy request (the params cannot tell it from a model default), the range of
OpenAI's temperature before 0 turns into greedy, and fields the engine never sees (``suffix``, ``best_of``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ModelWrapValidatorHandler, PrivateAttr, model_validator

from decoding import GenerationParams, ParameterError
from decoding.params import validate
from decoding.params.model_defaults import HONOURED
from server.knob_fields import knob_arguments, min_new_tokens
from server.watermark_protocol import WatermarkingConfigBody

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# knobs a model's generation_config.json may default (request > model > server default); the keys it
# sets that the server does not use are logged at load with the reason (decoding.model_defaults)
MODEL_DEFAULTABLE = tuple(sorted(HONOURED))
WARPERS = ("top_k", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class GenerationFields(_Strict):
    """Fields shared by both endpoints: OpenAI's, then transformers' GenerationConfig names."""

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
    # with custom_generate, the body's other fields are the method's keyword arguments (checked against
    # its signature in decoding.validation); without it they stay unknown fields (400 naming the first)
    _custom_generate_args: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _split_custom_generate_args(cls, data: Any, handler: ModelWrapValidatorHandler) -> Any:
        extra: dict[str, Any] = {}
        if isinstance(data, dict) and data.get("custom_generate") is not None:
            extra = {k: v for k, v in data.items() if k not in cls.model_fields}
            data = {k: v for k, v in data.items() if k in cls.model_fields}
        model = handler(data)
        if extra:
            model._custom_generate_args = extra
        return model

    # ---- translation ---------------------------------------------------------------------------------
    def _max_tokens(self, default: int | None) -> int | None:
        given = {k: v for k, v in self._max_token_fields().items() if v is not None}
        if len(set(given.values())) > 1:
            names = " and ".join(given)
            raise ParameterError(f"{names} disagree ({given}); give one", param=next(iter(given)))
        return next(iter(given.values()), default)

    def _max_token_fields(self) -> dict[str, int | None]:
        return {"max_tokens": self.max_tokens, "max_new_tokens": self.max_new_tokens}

    def to_params(
        self,
        *,
        default_max_tokens: int,
        model_defaults: dict[str, Any] | None = None,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
    ) -> GenerationParams:
        defaults = {k: v for k, v in (model_defaults or {}).items() if k in MODEL_DEFAULTABLE}
        set_fields = self.model_fields_set

        def pick(name: str, server_default: Any) -> Any:
            value = getattr(self, name)
            if name in set_fields and value is not None:
                return value
            return defaults.get(name, server_default)

        temperature = pick("temperature", 1.0)  # OpenAI's default: sample at temperature 1
        if not 0 <= temperature <= 100:  # checked here: a greedy request's params carry temperature 1
            raise ParameterError(f"temperature must be in [0, 100], got {temperature}", param="temperature")
        explicit_sample = self.do_sample if "do_sample" in set_fields else None
        if explicit_sample is None:
            do_sample = (
                temperature > 0 if "temperature" in set_fields else bool(defaults.get("do_sample", temperature > 0))
            )
        else:
            do_sample = explicit_sample
        if not do_sample:
            for name in WARPERS:
                if name == "top_k" and self.penalty_alpha:  # contrastive search's candidate count
                    continue
                if name in set_fields and getattr(self, name) not in (None, 0):
                    raise ParameterError(
                        f"{name} only applies when sampling; this request is greedy (temperature 0 or do_sample false)",
                        param=name,
                    )
        if self.min_new_tokens is not None and self.min_tokens is not None and self.min_new_tokens != self.min_tokens:
            raise ParameterError("min_new_tokens and min_tokens disagree; give one", param="min_tokens")
        n = self.n
        if self.num_return_sequences is not None:  # HF's name for OpenAI's n
            if "n" in set_fields and self.n != self.num_return_sequences:
                raise ParameterError(
                    f"n ({self.n}) and num_return_sequences ({self.num_return_sequences}) disagree; give one",
                    param="num_return_sequences",
                )
            n = self.num_return_sequences
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        top_k = pick("top_k", None)
        params = GenerationParams(
            max_new_tokens=self._max_tokens(defaults.get("max_new_tokens", default_max_tokens)),
            min_new_tokens=min_new_tokens(self, pick),
            ignore_eos=self.ignore_eos,
            max_time=pick("max_time", None),
            do_sample=do_sample,
            temperature=float(temperature) if do_sample else 1.0,
            top_k=top_k or None,
            top_p=float(pick("top_p", 1.0)),
            min_p=pick("min_p", None),
            typical_p=float(pick("typical_p", 1.0)),
            epsilon_cutoff=pick("epsilon_cutoff", 0.0) or 0.0,
            eta_cutoff=pick("eta_cutoff", 0.0) or 0.0,
            repetition_penalty=float(pick("repetition_penalty", 1.0)),
            no_repeat_ngram_size=pick("no_repeat_ngram_size", 0) or 0,
            bad_words_ids=pick("bad_words_ids", None),
            suppress_tokens=pick("suppress_tokens", None),
            num_beams=1 if self.num_beams is None else self.num_beams,
            num_beam_groups=1 if self.num_beam_groups is None else self.num_beam_groups,
            # beam-only model defaults apply to requests that ask for that search themselves
            diversity_penalty=(pick("diversity_penalty", 0.0) if (self.num_beam_groups or 1) > 1
                               else self.diversity_penalty) or 0.0,  # fmt: skip
            length_penalty=float(pick("length_penalty", 1.0)),
            early_stopping=pick("early_stopping", False),
            num_return_sequences=self.num_return_sequences or 1,
            penalty_alpha=self.penalty_alpha,
            dola_layers=self.dola_layers,
            prompt_lookup_num_tokens=self.prompt_lookup_num_tokens,
            max_matching_ngram_size=self.max_matching_ngram_size,
            num_assistant_tokens=self.num_assistant_tokens,
            num_assistant_tokens_schedule=self.num_assistant_tokens_schedule,
            assistant_confidence_threshold=self.assistant_confidence_threshold,
            assistant_early_exit=self.assistant_early_exit,
            assistant_model=self.assistant_model,
            n=n,
            seed=self.seed,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            logit_bias=_logit_bias(self.logit_bias),
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens,
            generation_preset=self.generation_preset,
            custom_generate=self.custom_generate,
            **knob_arguments(self, pick, self._max_token_fields()),
            watermarking_config=self.watermarking_config.config() if self.watermarking_config else None,
            guidance_scale=self.guidance_scale,
            negative_prompt=self.negative_prompt,
            negative_prompt_ids=self.negative_prompt_ids,
            custom_generate_args=dict(self._custom_generate_args) or None,
        )
        validate(params)
        return params

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


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


class CompletionRequest(GenerationFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None

    def params(self, model_defaults: dict[str, Any] | None = None) -> GenerationParams:
        """OpenAI's defaults for completions: 16 tokens; ``logprobs`` with ``echo`` also scores the prompt."""
        return self.to_params(
            default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS,
            model_defaults=model_defaults,
            logprobs=self.logprobs,
            prompt_logprobs=self.logprobs if self.echo and self.logprobs is not None else None,
        )

    def prompts_or_error(self) -> list[str | list[int]]:
        if self.suffix is not None:
            raise ParameterError("suffix is not supported", param="suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise ParameterError("best_of is not supported (use n, or num_beams for beam search)", param="best_of")
        prompt = self.prompt
        if isinstance(prompt, str):
            prompts: list = [prompt]
        elif prompt and all(isinstance(p, int) for p in prompt):
            prompts = [prompt]
        else:
            prompts = list(prompt)
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ParameterError("prompt must not be empty", param="prompt")
        return prompts


class ChatCompletionRequest(GenerationFields):
    messages: list[ChatMessage] = Field(default_factory=list)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None

    def _max_token_fields(self) -> dict[str, int | None]:
        return {**super()._max_token_fields(), "max_completion_tokens": self.max_completion_tokens}

    def params(self, model_defaults: dict[str, Any] | None, room: int) -> GenerationParams:
        """Chat's default length is what the context has left after the prompt (``room``, at least 1:
        a prompt that fills the context is then a context-length error naming ``messages``)."""
        return self.to_params(
            default_max_tokens=max(1, room), model_defaults=model_defaults, logprobs=self.logprobs_count()
        )

    def messages_or_error(self) -> list[dict[str, str]]:
        if not self.messages:
            raise ParameterError("messages must not be empty", param="messages")
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]

    def logprobs_count(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise ParameterError("top_logprobs requires logprobs=true", param="top_logprobs")
        if not self.logprobs:
            return None
        return self.top_logprobs or 0
