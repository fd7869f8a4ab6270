"""What an encoder-decoder model's request may ask for, checked before it reaches the engine.

The prompt is the encoder's input: it must fit the encoder's positions (Bart's 1024), while the
decoder's prompt (its start token) and the completion must fit the decoder's (``max_model_len``).
What ``generate()`` itself does not do for an encoder-decoder model (DoLa: "only for decoder-only
models") or what Decoda does not run on one yet (drafting with an assistant, prompt lookup or early
exit, classifier-free guidance, a prediction, adapters, custom methods, echoing or scoring the prompt)
is a 400 naming the field, never silently dropped.
"""

from __future__ import annotations

from decoding.params.errors import ParameterError
from decoding.params.generation import GenerationParams, Strategy, guidance_active

# field -> why it does not apply to an encoder-decoder model, checked in this order
_REFUSED = (
    ("dola_layers", lambda p: p.strategy is Strategy.DOLA,
     "DoLa decoding contrasts a decoder-only model's layers; generate() refuses it for encoder-decoder models"),
    ("assistant_model", lambda p: p.assistant_model is not None,
     "speculative decoding with an assistant is not served for encoder-decoder models yet"),
    ("prompt_lookup_num_tokens", lambda p: p.prompt_lookup_num_tokens is not None,
     "prompt lookup drafts from a decoder's own prompt, which an encoder-decoder model does not continue"),
    ("assistant_early_exit", lambda p: p.assistant_early_exit is not None,
     "self-speculative early exit is not served for encoder-decoder models yet"),
    ("guidance_scale", guidance_active,
     "classifier-free guidance runs an unconditional decoder-only prompt; not served for encoder-decoder models"),
    ("prediction", lambda p: p.prediction is not None or p.prediction_ids is not None,
     "a prediction drafts the decoder's continuation from the prompt; not served for encoder-decoder models"),
    ("model", lambda p: p.lora_name is not None, "LoRA adapters are served for decoder-only models"),
    ("custom_generate", lambda p: p.custom_generate is not None,
     "custom decoding methods are served for decoder-only models"),
    ("prompt_logprobs", lambda p: p.prompt_logprobs is not None,
     "the prompt is the encoder's input, which has no next-token probabilities"),
)  # fmt: skip


def check_seq2seq_request(params: GenerationParams, prompt_len: int, max_encoder_len: int | None) -> None:
    """Raise ``ParameterError`` for what an encoder-decoder model cannot serve (``prompt_len``: the
    encoder's tokens; ``max_encoder_len``: its positions, None where unbounded)."""
    for field, applies, why in _REFUSED:
        if applies(params):
            raise ParameterError(f"{field}: {why}", param=field, code="unsupported_for_model")
    if max_encoder_len is not None and prompt_len > max_encoder_len:
        raise ParameterError(
            f"This model's encoder takes at most {max_encoder_len} tokens; the prompt has {prompt_len}",
            param="prompt",
            code="context_length_exceeded",
        )
