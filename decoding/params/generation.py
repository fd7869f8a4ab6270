"""Every knob of one generation request, and the strategy HF would pick for them.

Field names mirror ``transformers.GenerationConfig`` exactly so a user's HF knowledge carries over;
serving fields (seed, stop, logit_bias, OpenAI penalties, logprobs, ...) sit beside them. This module
never imports torch: the HTTP layer builds and validates these objects before anything reaches the
worker, and the worker trusts them. The checks are ``decoding.params.validate``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum

from decoding.params.structured import StructuredOutput
from decoding.params.watermarking import WatermarkingConfig
from decoding.params.whisper import WhisperRules


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
    watermarking_config: WatermarkingConfig | None = None  # HF's (decoding/params/watermarking.py)
    # --- classifier-free guidance (issue 11) ---
    guidance_scale: float | None = None  # HF: CFG is on when set and not 1 (strategies/guidance.py)
    negative_prompt_ids: list[int] | None = None  # the unconditional branch's prompt (default: prompt's last token)
    negative_prompt: str | None = None  # text the server tokenizes into negative_prompt_ids before submitting
    # --- OpenAI's Predicted Outputs: text the reply is expected to repeat, a draft source for prompt lookup ---
    prediction: str | None = None  # text the server tokenizes into prediction_ids before submitting
    prediction_ids: list[int] | None = None  # searched before the row's own tokens (engine/drafting.py)
    # --- a thinking budget (Anthropic's thinking.budget_tokens): the end tag forced once it is spent ---
    thinking_budget: int | None = None  # the reply's tokens before the thinking must end (params/thinking.py)
    thinking_end_ids: list[int] | None = None  # the end tag's ids (``</think>``), forced one by one
    thinking_start_ids: list[int] | None = None  # the opening tag's ids; None: the prompt opened the thinking
    # --- Whisper's own suppressions and timestamp rules, set by the audio API (params/whisper.py) ---
    whisper: WhisperRules | None = None
    # --- LoRA adapters (issue 42): the adapter a request's ``model`` names; None runs the base model ---
    lora_name: str | None = None
    # --- scheduling (issue 55; decoding/engine/policy.py): who runs first, and whose share it counts in ---
    priority: int = 0  # vLLM's: lower runs first (the server refuses non-zero under --scheduling-policy fcfs)
    caller: str = ""  # who sent it, as the server names it ("key:<digest start>", "user:<id>"; "": anonymous)
    # --- custom decoding methods (issue 11) ---
    # a request's extra fields, the method's keyword arguments (server/translate/fields.py collects them)
    custom_generate_args: dict[str, object] | None = None
    # --- structured outputs (OpenAI response_format, vLLM structured_outputs) ---
    structured_output: StructuredOutput | None = None
    # its compiled grammar (decoding.structured.CompiledGrammar), attached by the engine client before
    # the request reaches the worker; never sent by a user
    compiled_grammar: object | None = None

    @property
    def strategy(self) -> Strategy:
        return resolve_strategy(self)

    def replace(self, **changes: object) -> GenerationParams:
        return dataclasses.replace(self, **changes)


def resolve_strategy(params: GenerationParams) -> Strategy:
    """HF's ``GenerationConfig.get_generation_mode`` rules, in its order of precedence."""
    if is_assisted(params):
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


def is_assisted(params: GenerationParams) -> bool:
    """Drafts come from somewhere (an assistant model, the prompt, the model's own early layers)."""
    return (
        params.assistant_model is not None
        or params.prompt_lookup_num_tokens is not None
        or params.assistant_early_exit is not None
    )


def guidance_active(params: GenerationParams) -> bool:
    """HF adds its CFG processor only for a guidance_scale other than 1 (at 1 it is the identity)."""
    return params.guidance_scale is not None and params.guidance_scale != 1

