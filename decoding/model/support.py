"""Which transformers models Decoda can serve, decided at load: refused with a reason, never wrong.

Decoda keeps a model's state in its paged KV cache and nowhere else, and runs attention itself
(``attention.decoda_attention``). So a model is servable when every layer's only state is K/V and
every layer's attention goes through transformers' ``AttentionInterface``. Two checks:

1. ``check_config``, before any weight is read: encoder-decoder models, and models whose layers
   keep recurrent or convolutional state (Mamba, Jamba, Falcon-H1, Qwen3-Next, LFM2, ...: layer
   types other than full or sliding attention, or a state size), are refused naming the
   architecture and the reason.
2. ``check_model``, on the loaded model: its attention must have switched to Decoda's (Falcon's
   does not use the interface), each layer must call it once per forward, and a short prompt run
   through the paged cache (one prefill chunk, then a decode step) must give the logits the same
   model gives with transformers' eager attention. That catches what no config field says:
   position information smuggled through the attention mask (ALiBi), masks Decoda does not build
   (chunked, bidirectional), a layer whose attention bypasses the interface. GIT's text attention,
   eager-only in transformers, is routed to Decoda's by its own mark (``git_forward.route_attention``)
   and checked the same way.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface, AutoModelForCausalLM

from decoding.kv.pool import KVPool
from decoding.model.git_forward import route_attention
from decoding.model.registry import ModelLoadError
from decoding.model.runner import ModelRunner, RowInput
from decoding.model.seq2seq import is_encoder_decoder
from decoding.model.seq2seq_check import check_seq2seq
from decoding.model.vision_tower import takes_images, vision_attention
from decoding.vision.git_prompt import is_git

ATTENTION_LAYER_TYPES = {"full_attention", "sliding_attention"}
# config fields that only a layer with recurrent or convolutional state has
_STATE_FIELDS = ("ssm_state_size", "mamba_d_state", "state_size", "linear_num_value_heads", "conv_L_cache")
# layer kinds (``layer_types``) whose layers carry state from token to token
_STATEFUL_WORDS = ("mamba", "linear", "conv", "recurrent", "hybrid", "ssm", "rwkv", "delta")
_PROBE_TOKENS = 7
# encoder-decoder families whose attention takes a relative position bias as an argument (not served yet)
# encoder-decoder families whose attention Decoda does not run: a relative bias per layer (UMT5), local or
# transient-global attention (LongT5), and T5 variants not tested here
_UNSERVED_SEQ2SEQ = {"umt5", "longt5", "switch_transformers", "pop2piano", "udop"}
# max |ours - eager| over the probe's logits, relative to their largest magnitude, by dtype
_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 6e-2, torch.float16: 2e-2}


def architecture(config: Any) -> str:
    """The name users know a config by: its ``model_type`` and, where set, its class name."""
    names = getattr(config, "architectures", None) or []
    model_type = getattr(config, "model_type", "") or type(config).__name__
    return f"{model_type} ({names[0]})" if names else model_type


def check_config(config: Any) -> None:
    """Refuse, before loading weights, what the paged KV cache cannot hold."""
    name = architecture(config)
    if getattr(config, "is_encoder_decoder", False):
        if getattr(config, "model_type", "") in _UNSERVED_SEQ2SEQ:
            raise ModelLoadError(
                f"architecture {name} is an encoder-decoder model whose attention Decoda does not run (a relative "
                "position bias per layer, or local attention); T5, mT5, Bart, mBART, Marian, Pegasus and Whisper "
                "are served"
            )
        return  # its decoder's layers are checked once loaded (``seq2seq.cross_attention_modules``, check_model)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    other = sorted(set(_layer_types(text)) - ATTENTION_LAYER_TYPES)
    stateful = [kind for kind in other if any(word in kind for word in _STATEFUL_WORDS)]
    if stateful:
        raise ModelLoadError(
            f"architecture {name} has {', '.join(stateful)} layers: they keep recurrent or convolutional state "
            "that Decoda's paged KV cache does not hold (only full and sliding-window attention layers are served)"
        )
    if other:
        raise ModelLoadError(
            f"architecture {name} has {', '.join(other)} layers, which Decoda's attention does not implement (it "
            "builds causal full and sliding-window masks only)"
        )
    state = [field for field in _STATE_FIELDS if getattr(text, field, None) is not None]
    if state:
        raise ModelLoadError(
            f"architecture {name} keeps recurrent state ({', '.join(state)} in its config) that Decoda's paged KV "
            "cache does not hold; only attention-only decoders are served"
        )


def check_attention_interface(config: Any) -> None:
    """Refuse, before loading weights, a causal LM class whose attention ignores ``AttentionInterface``
    (Falcon picks eager/SDPA/flash itself): it would never call Decoda's attention."""
    mapping = AutoModelForCausalLM._model_mapping
    if type(config) not in mapping:
        return  # remote code or an unknown class: from_pretrained and check_model decide
    model_class = mapping[type(config)]
    if not model_class._can_set_attn_implementation():
        raise ModelLoadError(
            f"architecture {config.model_type} ({model_class.__name__}) does not route its attention through "
            "transformers' AttentionInterface, so Decoda's paged attention and KV cache cannot run it"
        )


def _layer_types(config: Any) -> list[str]:
    for field in ("layer_types", "layers_block_type", "block_types"):
        value = getattr(config, field, None)
        if isinstance(value, list | tuple):
            return [str(kind) for kind in value]
    return []


def check_model(model: torch.nn.Module, attention_name: str) -> None:
    """Refuse a loaded model whose forward through Decoda's attention is not transformers' own."""
    config = model.config.get_text_config()
    name = architecture(model.config)
    if is_git(model.config):  # eager by transformers' choice; its layers are routed to ours (git_forward)
        route_attention(model)
    elif getattr(config, "_attn_implementation", None) != attention_name:  # a VLM's language model's
        raise ModelLoadError(
            f"architecture {name} does not route its attention through transformers' AttentionInterface, so "
            "Decoda's paged attention cannot run it"
        )
    if is_encoder_decoder(model.config):
        check_seq2seq(model, name)
        return
    try:
        calls, ours = _probe(model, attention_name, config.vocab_size)
    except ModelLoadError:
        raise
    except Exception as error:  # a family the runner cannot drive at all
        raise ModelLoadError(f"architecture {name} cannot run on Decoda's paged attention: {error}") from error
    layers = config.num_hidden_layers
    if sorted(calls) != sorted(list(range(layers)) * 2):  # each layer once in each of the two forwards
        raise ModelLoadError(
            f"architecture {name}: Decoda's attention ran for layers {sorted(set(calls))} of {layers}; a layer "
            "that keeps state outside the KV cache or attends some other way cannot be served"
        )
    reference, reference_noise = _eager_logits(model, attention_name, config.vocab_size)
    scale = reference.abs().max().clamp(min=1e-6)
    error = float((ours - reference).abs().max() / scale)
    noise = float(reference_noise / scale)  # ours may move as far as transformers' own forwards do
    tolerance = max(_TOLERANCE.get(next(model.parameters()).dtype, 1e-3), 4 * noise)
    if not error <= tolerance:
        raise ModelLoadError(
            f"architecture {name} gives different logits through Decoda's paged attention than through "
            f"transformers' eager attention (relative error {error:.2g}); it needs attention Decoda does not "
            "implement (for example ALiBi or a chunked or bidirectional mask)"
        )


def _probe_ids(vocab_size: int) -> list[int]:
    return [(7 * i + 3) % vocab_size for i in range(_PROBE_TOKENS)]


@torch.inference_mode()
def _probe(model: torch.nn.Module, attention_name: str, vocab_size: int) -> tuple[list[int], torch.Tensor]:
    """Layer indices Decoda's attention saw, and the probe's logits: a prefill chunk, then one decode step."""
    device = next(model.parameters()).device
    ids = _probe_ids(vocab_size)
    pool = KVPool.for_model(model, num_slots=1, max_model_len=_PROBE_TOKENS, device=device, block_size=4)
    runner = ModelRunner(model, pool, device)
    slot = pool.allocate()
    calls: list[int] = []
    original = AttentionInterface._global_mapping[attention_name]

    def counting(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        calls.append(module.layer_idx)
        return original(module, *args, **kwargs)

    AttentionInterface.register(attention_name, counting)
    try:
        first = runner.forward([RowInput(slot, 0, ids[:-1], 0)])[0]
        last = runner.forward([RowInput(slot, len(ids) - 1, ids[-1:], 0)])[0]
    finally:
        AttentionInterface.register(attention_name, original)
    return calls, torch.cat([first, last])


@torch.inference_mode()
def _eager_logits(model: torch.nn.Module, attention_name: str, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The probe's logits through transformers' eager attention, and how far the model's own numerics
    move: the largest difference from the same logits computed each position as the last of its own
    prefix (low-bit kernels round differently by row count) or through transformers' SDPA attention
    (in bfloat16 two correct attentions differ by a few percent of the largest logit, as ours may)."""
    device = next(model.parameters()).device
    ids = torch.tensor([_probe_ids(vocab_size)], device=device)
    model.set_attn_implementation("eager")
    try:
        whole = model(input_ids=ids, use_cache=False).logits[0].float()
        last = [model(input_ids=ids[:, : i + 1], use_cache=False).logits[0, -1:].float() for i in range(ids.shape[1])]
        noise = (torch.cat(last) - whole).abs().max()
        try:
            model.set_attn_implementation("sdpa")
        except (ValueError, ImportError):  # a family without SDPA support: the prefixes' noise alone
            return whole, noise
        sdpa = model(input_ids=ids, use_cache=False).logits[0].float()
        return whole, torch.maximum(noise, (sdpa - whole).abs().max())
    finally:  # a vision-language model's vision tower goes back to SDPA
        model.set_attn_implementation(vision_attention(attention_name, model.config) if takes_images(model.config)
                                      else attention_name)  # fmt: skip
