"""A tiny but complete GGUF file, as llama.cpp lays one out: metadata transformers builds the config and
a byte-level BPE tokenizer from, and every tensor of the model (quantized linears and embeddings,
float norms and biases), with random values. Both of Decoda's GGUF loaders read it whole, so tests
can compare them on the same file with no network and in seconds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from accelerate import init_empty_weights
from gguf import MODEL_ARCH_NAMES, GGMLQuantizationType, GGUFWriter, get_tensor_name_map, quants
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Qwen2Config
from transformers.convert_slow_tokenizer import bytes_to_unicode

T = GGMLQuantizationType
HIDDEN, HEADS, KV_HEADS, LAYERS, FFN = 64, 4, 2, 2, 128
MERGES = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n", "Ġ w", "e r", "o n"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# block types by GGUF tensor kind: a mix of 4-, 5- and 8-bit codes, asymmetric and symmetric
KINDS = {"attn_q": T.Q4_0, "attn_k": T.Q4_1, "attn_v": T.Q5_0, "attn_output": T.Q4_0,
         "ffn_gate": T.Q4_1, "ffn_up": T.Q5_1, "ffn_down": T.Q4_0, "token_embd": T.Q8_0, "output": T.Q8_0}  # fmt: skip


def vocabulary() -> list[str]:
    base = list(bytes_to_unicode().values())
    return base + ["".join(m.split()) for m in MERGES] + SPECIALS


def config_of(arch: str, *, tied: bool) -> object:
    common = dict(
        vocab_size=len(vocabulary()), hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=tied,
    )  # fmt: skip
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen2":
        return Qwen2Config(**common)
    return Gemma3TextConfig(**common, head_dim=HIDDEN // HEADS, sliding_window=64)


def write_tiny_gguf(path: Path, arch: str = "qwen2", *, tied: bool = False, seed: int = 0) -> Path:
    """``arch``: llama, qwen2 (q/k/v biases) or gemma3 (q/k norms); ``tied``: no output.weight in the file."""
    config = config_of(arch, tied=tied)
    with init_empty_weights():
        shapes = AutoModelForCausalLM.from_config(config)  # names and shapes only
    shapes.tie_weights()  # a tied head is the embedding: no output.weight of its own
    names = get_tensor_name_map(next(k for k, v in MODEL_ARCH_NAMES.items() if v == arch), LAYERS)
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(path), arch)
    writer.add_name(f"tiny {arch}")
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    if arch == "gemma3":
        writer.add_key_length(HIDDEN // HEADS)
        writer.add_value_length(HIDDEN // HEADS)
        writer.add_sliding_window(64)
    _add_tokenizer(writer)
    for hf_name, param in shapes.named_parameters():
        stem, _, suffix = hf_name.rpartition(".")
        gguf_stem = names.get_name(stem)
        if gguf_stem is None:
            raise AssertionError(f"no GGUF name for {hf_name}")
        values = rng.standard_normal(tuple(param.shape)).astype(np.float32) * 0.2
        if "norm" in gguf_stem:
            values = 1.0 + values * 0.25
        kind = KINDS.get(gguf_stem.split(".")[-1]) if param.dim() == 2 else None
        if kind is None:
            writer.add_tensor(f"{gguf_stem}.{suffix}", values)
        else:
            writer.add_tensor(f"{gguf_stem}.{suffix}", quants.quantize(values, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_tokenizer(writer: GGUFWriter) -> None:
    tokens = vocabulary()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


def prompt_ids() -> torch.Tensor:
    return torch.tensor([[5, 90, 257, 31, 200, 7, 258, 100]])
