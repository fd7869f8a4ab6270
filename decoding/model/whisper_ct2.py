"""A CTranslate2 Whisper (``WhisperSpec``) read into transformers' ``WhisperForConditionalGeneration``.

faster-whisper's models are CTranslate2 folders: ``model.bin`` plus ``config.json`` (alignment heads,
language ids, suppressed ids), ``tokenizer.json`` and ``vocabulary.txt``. CTranslate2's converter
(``converters/transformers.py``, ``WhisperLoader``) wrote them from transformers' own Whisper, so the
way back is its mapping read backwards:

* each self-attention's ``linear_0`` is q, k and v fused along the output rows (``[3 * d, d]``), its
  bias with zeros where k's would be (Whisper's ``k_proj`` has no bias: a nonzero one is refused);
  a cross-attention's ``linear_0`` is q and its ``linear_1`` k and v fused; the last linear is
  ``out_proj``;
* ``ffn/linear_0``/``linear_1`` are ``fc1``/``fc2``; a layer norm's ``gamma``/``beta`` its weight and
  bias; ``self_attention/layer_norm``, ``attention/layer_norm`` and ``ffn/layer_norm`` are
  ``self_attn_layer_norm``, ``encoder_attn_layer_norm`` and ``final_layer_norm``;
* ``encoder/conv1``, ``conv2``, both ``position_encodings`` (learned tables: the sizes of the 30 s
  window and of the decoder's 448 positions) and both final layer norms as they are;
* ``decoder/projection/weight`` is an alias of the embeddings: the tied ``proj_out``.

Every size comes from the variables' shapes and the spec's ``num_heads`` scalars, so any Whisper size
(tiny to large-v3's 128 mel bins) reads the same way. Weights are widened to float32 (exact from the
stored float16) and cast to the served dtype. Settings the spec stores and transformers' Whisper
cannot follow (post-norm, another activation, scaled embeddings, quantized weights) are refused
naming them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import WhisperConfig, WhisperForConditionalGeneration

from decoding.model.ct2_file import Ct2FormatError, Ct2Model, read_ct2

# CTranslate2's ``Activation`` enum (specs/common_spec.py): Whisper's decoder says GELU
_GELU = 3
# the spec's flags and the value transformers' Whisper implies, with what a different value would mean
_FLAGS = {
    "decoder/pre_norm": (1, "post-norm layers"),
    "decoder/activation": (_GELU, "an activation other than GELU"),
    "decoder/scale_embeddings": (0, "scaled token embeddings"),
    "decoder/alibi": (0, "ALiBi position biases"),
}


def whisper_config(ct2: Ct2Model, special_ids: dict[str, int]) -> WhisperConfig:
    """transformers' config for the spec's sizes; ``special_ids`` gives the token ids the tokenizer names
    (``bos``/``eos``/``pad`` = ``<|endoftext|>``, ``decoder_start`` = ``<|startoftranscript|>``)."""
    if ct2.spec != "WhisperSpec":
        raise Ct2FormatError(f"{ct2.path.name} holds a CTranslate2 {ct2.spec}, not a WhisperSpec")
    for name, (expected, meaning) in _FLAGS.items():
        if ct2.has(name) and ct2.get(name).scalar() != expected:
            raise Ct2FormatError(
                f"{ct2.path.name} has {name}={ct2.get(name).scalar()} ({meaning}), which Whisper has not"
            )
    quantized = sorted(n for n in ct2.variables if n.endswith("_scale"))
    if quantized:
        raise Ct2FormatError(f"{ct2.path.name} holds quantized weights ({quantized[0]}, ...); a float model is needed")
    vocab, d_model = ct2.get("decoder/embeddings/weight").values.shape
    ffn = {side: ct2.get(f"{side}/layer_0/ffn/linear_0/weight").values.shape[0] for side in ("encoder", "decoder")}
    return WhisperConfig(
        vocab_size=vocab,
        num_mel_bins=ct2.get("encoder/conv1/weight").values.shape[1],
        d_model=d_model,
        encoder_layers=_layer_count(ct2, "encoder"),
        decoder_layers=_layer_count(ct2, "decoder"),
        encoder_attention_heads=ct2.get("encoder/num_heads").scalar(),
        decoder_attention_heads=ct2.get("decoder/num_heads").scalar(),
        encoder_ffn_dim=ffn["encoder"],
        decoder_ffn_dim=ffn["decoder"],
        max_source_positions=ct2.get("encoder/position_encodings/encodings").values.shape[0],
        max_target_positions=ct2.get("decoder/position_encodings/encodings").values.shape[0],
        activation_function="gelu",
        scale_embedding=False,
        tie_word_embeddings=True,
        bos_token_id=special_ids["bos"],
        eos_token_id=special_ids["eos"],
        pad_token_id=special_ids["pad"],
        decoder_start_token_id=special_ids["decoder_start"],
        architectures=["WhisperForConditionalGeneration"],
    )


def _layer_count(ct2: Ct2Model, side: str) -> int:
    count = 0
    while ct2.has(f"{side}/layer_{count}/ffn/linear_0/weight"):
        count += 1
    if count == 0:
        raise Ct2FormatError(f"{ct2.path.name} has no {side} layers")
    return count


def whisper_state_dict(ct2: Ct2Model, config: WhisperConfig) -> dict[str, torch.Tensor]:
    """transformers' parameter names → float32 tensors, every one of the model's (``proj_out`` tied)."""
    state: dict[str, torch.Tensor] = {}

    def put(hf: str, values: np.ndarray) -> None:
        state[hf] = torch.from_numpy(np.ascontiguousarray(values))

    def linear(hf: str, ct: str, bias: bool = True) -> None:
        put(f"{hf}.weight", _float(ct2, f"{ct}/weight"))
        if bias:
            put(f"{hf}.bias", _float(ct2, f"{ct}/bias"))

    def norm(hf: str, ct: str) -> None:
        put(f"{hf}.weight", _float(ct2, f"{ct}/gamma"))
        put(f"{hf}.bias", _float(ct2, f"{ct}/beta"))

    def fused(hf: str, ct: str, names: tuple[str, ...]) -> None:
        """Split a fused projection's rows into ``names`` (q, k, v or k, v); k gets no bias."""
        weight, bias = _float(ct2, f"{ct}/weight"), _float(ct2, f"{ct}/bias")
        d_model = weight.shape[1]
        if weight.shape[0] != len(names) * d_model:
            raise Ct2FormatError(f"{ct}/weight is {list(weight.shape)}, not {len(names)} fused [{d_model}, {d_model}]")
        for index, name in enumerate(names):
            rows = slice(index * d_model, (index + 1) * d_model)
            put(f"{hf}.{name}.weight", weight[rows])
            if name != "k_proj":
                put(f"{hf}.{name}.bias", bias[rows])
            elif np.any(bias[rows]):
                raise Ct2FormatError(f"{ct}/bias has a nonzero key bias; Whisper's k_proj has none")

    for side, layers in (("encoder", config.encoder_layers), ("decoder", config.decoder_layers)):
        prefix = f"model.{side}"
        put(f"{prefix}.embed_positions.weight", _float(ct2, f"{side}/position_encodings/encodings"))
        norm(f"{prefix}.layer_norm", f"{side}/layer_norm")
        for i in range(layers):
            hf, ct = f"{prefix}.layers.{i}", f"{side}/layer_{i}"
            fused(f"{hf}.self_attn", f"{ct}/self_attention/linear_0", ("q_proj", "k_proj", "v_proj"))
            linear(f"{hf}.self_attn.out_proj", f"{ct}/self_attention/linear_1")
            norm(f"{hf}.self_attn_layer_norm", f"{ct}/self_attention/layer_norm")
            if side == "decoder":
                linear(f"{hf}.encoder_attn.q_proj", f"{ct}/attention/linear_0")
                fused(f"{hf}.encoder_attn", f"{ct}/attention/linear_1", ("k_proj", "v_proj"))
                linear(f"{hf}.encoder_attn.out_proj", f"{ct}/attention/linear_2")
                norm(f"{hf}.encoder_attn_layer_norm", f"{ct}/attention/layer_norm")
            linear(f"{hf}.fc1", f"{ct}/ffn/linear_0")
            linear(f"{hf}.fc2", f"{ct}/ffn/linear_1")
            norm(f"{hf}.final_layer_norm", f"{ct}/ffn/layer_norm")
    for conv in ("conv1", "conv2"):
        linear(f"model.encoder.{conv}", f"encoder/{conv}")
    put("model.decoder.embed_tokens.weight", _float(ct2, "decoder/embeddings/weight"))
    if ct2.has("decoder/projection/bias"):
        raise Ct2FormatError(f"{ct2.path.name} has an output bias (decoder/projection/bias); Whisper's has none")
    projection = ct2.get("decoder/projection/weight")
    if projection.name != "decoder/embeddings/weight" and not np.array_equal(
        projection.values, ct2.get("decoder/embeddings/weight").values
    ):
        raise Ct2FormatError(f"{ct2.path.name}'s output projection differs from its embeddings; Whisper ties them")
    state["proj_out.weight"] = state["model.decoder.embed_tokens.weight"]
    return state


def _float(ct2: Ct2Model, name: str) -> np.ndarray:
    return ct2.get(name).as_float32()


def whisper_model(
    model_bin: Path, special_ids: dict[str, int], dtype: torch.dtype = torch.float32
) -> WhisperForConditionalGeneration:
    """The model from ``model_bin``, in eval mode and ``dtype``; every parameter comes from the file."""
    ct2 = read_ct2(model_bin)
    config = whisper_config(ct2, special_ids)
    state = whisper_state_dict(ct2, config)
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    expected = set(model.state_dict())
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise Ct2FormatError(f"{model_bin.name} → Whisper: missing {missing[:3]}, unexpected {extra[:3]}")
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    left = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_meta]
    if left:
        raise Ct2FormatError(f"{model_bin.name} → Whisper left {left[:3]} unset")
    return model.to(dtype).eval()
