"""The decoder-only families the architecture matrix serves: a tiny random config for each.

Every entry builds a model of 2-4 layers, hidden 64, from its transformers config class, with the
knobs that make the family what it is turned on (sliding windows small enough that a short prompt
crosses them, soft-capping, MoE routing, partial rotary, NoPE layers, MLA, attention sinks). The
vocabulary is small (``VOCAB``) so the reused SmolLM2 tokenizer covers every id and eos is a real
candidate. ``tests/test_architectures.py`` runs the matrix; ``tests/write_arch_table.py`` writes the
README's table from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers

VOCAB = 96
EOS = 2
INIT_STD = 0.5
WINDOW = 6  # sliding windows this short are crossed by every test prompt
_IDS = dict(bos_token_id=1, eos_token_id=EOS, pad_token_id=0)
_SHAPE = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4, max_position_embeddings=256
)


@dataclass(frozen=True)
class Family:
    """One architecture: its ``model_type``, how to build a tiny one, and what makes it special."""

    model_type: str
    config: Callable[[], transformers.PretrainedConfig]
    features: str  # what the matrix exercises in it (the README table's column)
    skip: dict[str, str] = field(default_factory=dict)  # strategy -> why it is not run for this family
    refused: str | None = None  # for a family Decoda refuses: words its load error must contain

    def build(self, seed: int = 0) -> torch.nn.Module:
        torch.manual_seed(seed)
        config = self.config()
        # transformers' default init (std 0.02) makes a tiny model repeat its last token, which any
        # attention bug also does; wider weights and an untied head make every position count
        config.initializer_range = INIT_STD
        config.tie_word_embeddings = False
        return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()

    def save(self, folder: Path) -> None:
        """The config alone: a refused family is refused before any weight is read."""
        self.config().save_pretrained(folder)


def _cfg(name: str, **kwargs: object) -> Callable[[], transformers.PretrainedConfig]:
    def make() -> transformers.PretrainedConfig:
        return getattr(transformers, name)(**kwargs)

    return make


_GQA = dict(_SHAPE, num_hidden_layers=2, num_key_value_heads=2, **_IDS)

FAMILIES: list[Family] = [
    Family("llama", _cfg("LlamaConfig", **_GQA), "GQA, RoPE"),
    Family("mistral", _cfg("MistralConfig", **_GQA, sliding_window=WINDOW), "sliding window"),
    Family(
        "mixtral",
        _cfg("MixtralConfig", **_GQA, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW),
        "MoE (top-2 of 4), sliding window",
    ),
    Family(
        "qwen3_moe",
        _cfg("Qwen3MoeConfig", **_GQA, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
        "MoE, q/k norm",
    ),
    Family("qwen2", _cfg("Qwen2Config", **_GQA), "QKV bias"),
    Family("qwen3", _cfg("Qwen3Config", **_GQA, head_dim=16), "q/k norm"),
    Family("gemma", _cfg("GemmaConfig", **_GQA, head_dim=16), "scaled embeddings, GeGLU"),
    Family(
        "gemma2",
        _cfg(
            "Gemma2Config",
            **dict(_GQA, num_hidden_layers=4),
            head_dim=16,
            sliding_window=WINDOW,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
            query_pre_attn_scalar=24,
        ),
        "attention + final logit soft-capping, alternating sliding layers",
    ),
    Family(
        "gemma3_text",
        _cfg(
            "Gemma3TextConfig",
            **dict(_GQA, num_hidden_layers=4),
            head_dim=16,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        ),
        "sliding/global layers, two RoPE bases, q/k norm",
    ),
    Family("phi3", _cfg("Phi3Config", **_GQA), "fused QKV, fused gate-up"),
    Family("olmo2", _cfg("Olmo2Config", **_GQA), "post-norm, q/k norm"),
    Family(
        "granite",
        _cfg(
            "GraniteConfig",
            **_GQA,
            embedding_multiplier=3.0,
            residual_multiplier=0.5,
            attention_multiplier=0.2,
            logits_scaling=4.0,
        ),
        "embedding/residual/attention multipliers, logit scaling",
    ),
    Family("starcoder2", _cfg("Starcoder2Config", **_GQA, sliding_window=WINDOW), "LayerNorm, biases, sliding window"),
    Family("cohere", _cfg("CohereConfig", **_GQA, logit_scale=0.5), "parallel block, logit scale"),
    Family("stablelm", _cfg("StableLmConfig", **_GQA, partial_rotary_factor=0.25), "partial rotary"),
    Family(
        "gpt_neox",
        _cfg(
            "GPTNeoXConfig",
            **{k: v for k, v in _SHAPE.items() if k != "num_key_value_heads"},
            num_hidden_layers=2,
            rotary_pct=0.25,
            bos_token_id=1,
            eos_token_id=EOS,
        ),
        "partial rotary, parallel residual",
    ),
    Family(
        "gpt2",
        _cfg(
            "GPT2Config",
            vocab_size=VOCAB,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=256,
            bos_token_id=1,
            eos_token_id=EOS,
        ),
        "absolute positions, Conv1D",
    ),
    Family(
        "smollm3",
        _cfg("SmolLM3Config", **dict(_GQA, num_hidden_layers=4), no_rope_layers=[1, 1, 1, 0]),
        "NoPE layers",
    ),
    Family(
        "deepseek_v3",
        _cfg(
            "DeepseekV3Config",
            **dict(_GQA, num_key_value_heads=4),
            kv_lora_rank=32,
            q_lora_rank=48,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=12,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
        ),
        "MLA (K and V of different head dims), MoE",
    ),
    Family(
        "gpt_oss",
        _cfg(
            "GptOssConfig",
            **_GQA,
            head_dim=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"],
        ),
        "attention sinks, MoE, alternating sliding layers",
    ),
]

# beyond the list: more ways to arrange the same pieces
FAMILIES += [
    Family(
        "cohere2",
        _cfg(
            "Cohere2Config",
            **dict(_GQA, num_hidden_layers=4),
            sliding_window=WINDOW,
            logit_scale=0.5,
            layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        ),
        "sliding layers with RoPE, global layers without",
    ),
    Family(
        "qwen2_moe",
        _cfg(
            "Qwen2MoeConfig",
            **_GQA,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
        ),
        "MoE with a shared expert",
    ),
    Family(
        "olmo3",
        _cfg("Olmo3Config", **dict(_GQA, num_hidden_layers=4), sliding_window=WINDOW),
        "sliding layers, q/k norm",
    ),
    Family(
        "exaone4",
        _cfg("Exaone4Config", **dict(_GQA, num_hidden_layers=4), sliding_window=WINDOW, sliding_window_pattern=4),
        "3 sliding : 1 global, post-norm",
    ),
    Family("glm4", _cfg("Glm4Config", **_GQA, head_dim=16), "partial rotary, sandwich norms"),
    Family(
        "granitemoe", _cfg("GraniteMoeConfig", **_GQA, num_local_experts=4, num_experts_per_tok=2), "MoE, multipliers"
    ),
    Family("olmoe", _cfg("OlmoeConfig", **_GQA, num_experts=4, num_experts_per_tok=2), "MoE, q/k norm"),
]

# refused at load, each for its reason
REFUSED: list[Family] = [
    Family(
        "falcon",
        _cfg(
            "FalconConfig",
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=256,
            bos_token_id=1,
            eos_token_id=EOS,
        ),
        "multi-query attention, parallel attention",
        refused="AttentionInterface",
    ),
    Family(
        "mamba",
        _cfg("MambaConfig", vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2),
        "selective state space",
        refused="recurrent",
    ),
    Family(
        "jamba",
        _cfg("JambaConfig", vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2),
        "Mamba + attention hybrid",
        refused="recurrent",
    ),
    Family(
        "falcon_h1",
        _cfg("FalconH1Config", vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2),
        "parallel Mamba-2 + attention",
        refused="recurrent",
    ),
    Family(
        "qwen3_next",
        _cfg("Qwen3NextConfig", vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4),
        "gated DeltaNet + attention",
        refused="recurrent",
    ),
    Family(
        "lfm2",
        _cfg("Lfm2Config", vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2),
        "short convolutions",
        refused="recurrent",
    ),
    Family(
        "llama4_text",
        _cfg("Llama4TextConfig", vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4),
        "chunked attention",
        refused="does not implement",
    ),
    Family(
        "umt5", _cfg("UMT5Config", vocab_size=VOCAB, d_model=64, num_layers=2),
        "encoder-decoder, a relative position bias per layer", refused="relative position bias per layer"
    ),
]

BY_TYPE = {family.model_type: family for family in FAMILIES + REFUSED}
