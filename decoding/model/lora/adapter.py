"""A PEFT LoRA adapter folder read into per-module ``A``/``B`` matrices, or refused with the reason.

The folder is what ``PeftModel.save_pretrained`` writes: ``adapter_config.json`` (read with PEFT's
own ``LoraConfig``, so every field means what PEFT means by it) and ``adapter_model.safetensors``
(``base_model.model.<module>.lora_A.weight`` ``[r, in]``, ``...lora_B.weight`` ``[out, r]``). The
forward PEFT runs for a plain LoRA layer is ``base(x) + lora_B(lora_A(x)) * scaling`` with
``scaling = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with ``use_rslora``); that is the whole of
what Decoda serves. What would make PEFT's forward something else is refused, with the reason,
instead of being served wrong: DoRA, trained biases, ``modules_to_save`` (whole layers replaced),
per-module rank or alpha patterns, layer replication, a target Decoda does not wrap, a rank above
``--max-lora-rank``, and a base the adapter was not trained on (its matrices' shapes; the base named
by the folder when it is a readable local model folder, or by vLLM's ``base_model_name``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PREFIX = "base_model.model."
# LoraConfig fields whose non-default value changes the forward PEFT runs: (field, why it is refused)
_REFUSED = (
    ("use_dora", "DoRA (use_dora) rescales the merged weight per column; only plain LoRA is served"),
    ("modules_to_save", "modules_to_save replaces whole layers with trained copies; only LoRA deltas are served"),
    ("lora_bias", "lora_bias trains a bias on lora_B; only bias-free deltas are served"),
    ("rank_pattern", "rank_pattern gives modules their own rank; one rank per adapter is served"),
    ("alpha_pattern", "alpha_pattern gives modules their own alpha; one alpha per adapter is served"),
    ("layer_replication", "layer_replication changes the base model's layer stack"),
    ("trainable_token_indices", "trainable_token_indices trains embedding rows; only linear deltas are served"),
    ("target_parameters", "target_parameters adapts raw parameters (MoE experts); only linear modules are served"),
    ("alora_invocation_tokens", "activated LoRA (alora_invocation_tokens) applies per token span"),
    ("arrow_config", "Arrow routing mixes adapters per token"),
    ("use_qalora", "QALoRA pools the input per group before lora_A"),
    ("fan_in_fan_out", "fan_in_fan_out (Conv1D weights) is not served"),
)


class LoraRefused(ValueError):
    """The adapter cannot be served as PEFT would run it; the message says why."""


@dataclass
class LoraWeights:
    """One adapter as the engine applies it: per wrapped module, ``A`` ``[in, r]`` and ``B`` ``[r, out]``."""

    name: str
    path: str
    rank: int
    scaling: float
    matrices: dict[str, tuple[torch.Tensor, torch.Tensor]]  # module name -> (A^T, B^T)
    base_model_name: str | None = None
    source: tuple = ()  # ``adapter_source`` of the folder read: adapters with the same one share ``matrices``


def adapter_source(path: str | Path) -> tuple:
    """What identifies an adapter folder's contents without reading them: its resolved path and its two
    files' modification times and sizes (a folder rewritten since is read again)."""
    folder = Path(path).resolve()
    stats = [(folder / name).stat() for name in (CONFIG_FILE, WEIGHTS_FILE)]
    return (str(folder), *((stat.st_mtime_ns, stat.st_size) for stat in stats))


def check_base_model_name(name: str, base_model_name: str | None, served_names: tuple[str, ...]) -> None:
    """vLLM's JSON form's ``base_model_name`` must be one of the served model's names."""
    if base_model_name is not None and served_names and base_model_name not in served_names:
        raise LoraRefused(f"LoRA adapter {name!r}: its base_model_name {base_model_name!r} is not the served model "
                          f"({', '.join(served_names)})")  # fmt: skip


def read_adapter(
    name: str, path: str | Path, targets: dict[str, tuple[int, int]], max_rank: int,
    served_config: object | None = None, base_model_name: str | None = None, served_names: tuple[str, ...] = (),
) -> LoraWeights:  # fmt: skip
    """Read and check the adapter at ``path`` against the served model.

    ``targets``: module name -> ``(in_features, out_features)`` of every linear Decoda wraps.
    ``served_config``: the served model's config (for a readable local base folder's comparison).
    ``base_model_name``: vLLM's JSON form's base (must be one of ``served_names``).
    """
    from peft import LoraConfig  # PEFT's own reading of the config; imported where an adapter is loaded

    folder = Path(path)
    if not (folder / CONFIG_FILE).is_file():
        raise LoraRefused(f"LoRA adapter {name!r}: {folder} has no {CONFIG_FILE} (a PEFT adapter folder)")
    if not (folder / WEIGHTS_FILE).is_file():
        raise LoraRefused(f"LoRA adapter {name!r}: {folder} has no {WEIGHTS_FILE} (save it with safetensors)")
    source = adapter_source(folder)  # before reading: a folder rewritten meanwhile is not taken for this one
    raw = json.loads((folder / CONFIG_FILE).read_text())
    if raw.get("peft_type") != "LORA":
        raise LoraRefused(f"LoRA adapter {name!r}: peft_type is {raw.get('peft_type')!r}; only LORA is served")
    config = LoraConfig.from_pretrained(str(folder))
    _check_config(name, config, max_rank)
    check_base_model_name(name, base_model_name, served_names)
    _check_base_folder(name, config.base_model_name_or_path, served_config)
    rank = int(config.r)
    scaling = config.lora_alpha / (math.sqrt(rank) if config.use_rslora else rank)
    matrices = _matrices(name, load_file(str(folder / WEIGHTS_FILE)), targets, rank)
    if not matrices:
        raise LoraRefused(f"LoRA adapter {name!r}: {WEIGHTS_FILE} holds no lora_A/lora_B weights")
    return LoraWeights(name, str(folder), rank, float(scaling), matrices, base_model_name, source)


def _check_config(name: str, config: object, max_rank: int) -> None:
    for field, why in _REFUSED:
        value = getattr(config, field, None)
        if value:  # None, False, {}, [] are the defaults that leave PEFT's plain LoRA forward
            raise LoraRefused(f"LoRA adapter {name!r} is refused: {why} ({field}={value!r})")
    bias = getattr(config, "bias", "none")
    if bias != "none":
        raise LoraRefused(f"LoRA adapter {name!r} is refused: bias={bias!r} trains the base layers' biases; "
                          "only bias='none' is served")  # fmt: skip
    rank = int(config.r)
    if rank > max_rank:
        raise LoraRefused(f"LoRA adapter {name!r} has rank {rank}, above --max-lora-rank {max_rank}")
    if rank < 1:
        raise LoraRefused(f"LoRA adapter {name!r} has rank {rank}; it must be at least 1")


def _check_base_folder(name: str, base: str | None, served_config: object | None) -> None:
    """A base named by a local folder with a config is compared with the served model's config; a hub
    id cannot be read without the network, so the matrices' shapes are the check then."""
    if not base or served_config is None:
        return
    config_file = Path(base) / "config.json"
    if not config_file.is_file():
        return
    theirs = json.loads(config_file.read_text())
    theirs = theirs.get("text_config", theirs)
    ours = served_config.get_text_config()  # type: ignore[attr-defined]
    for key in ("model_type", "hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size"):
        if key in theirs and getattr(ours, key, None) is not None and theirs[key] != getattr(ours, key):
            raise LoraRefused(f"LoRA adapter {name!r} was trained on {base} ({key}={theirs[key]!r}), not on the "
                              f"served model ({key}={getattr(ours, key)!r})")  # fmt: skip


def _matrices(
    name: str, tensors: dict[str, torch.Tensor], targets: dict[str, tuple[int, int]], rank: int
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    found: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        module, _, kind = key.removeprefix(_PREFIX).rpartition(".lora_")
        if kind not in ("A.weight", "B.weight"):
            raise LoraRefused(f"LoRA adapter {name!r}: {WEIGHTS_FILE} holds {key}, which is not a lora_A/lora_B "
                              "weight (a trained module or embedding Decoda does not serve)")  # fmt: skip
        found.setdefault(module, {})[kind[0]] = tensor
    matrices = {}
    for module, parts in sorted(found.items()):
        if module not in targets:
            raise LoraRefused(f"LoRA adapter {name!r} targets {module}, which Decoda does not adapt (it adapts the "
                              "attention and MLP projections q/k/v/o_proj, gate/up/down_proj of the served "
                              "model's layers)")  # fmt: skip
        if set(parts) != {"A", "B"}:
            raise LoraRefused(f"LoRA adapter {name!r}: {module} has lora_{'A' if 'A' in parts else 'B'} only")
        a, b = parts["A"], parts["B"]
        in_features, out_features = targets[module]
        if a.shape != (rank, in_features) or b.shape != (out_features, rank):
            raise LoraRefused(f"LoRA adapter {name!r} does not fit the served model: {module} has lora_A "
                              f"{tuple(a.shape)} and lora_B {tuple(b.shape)}, the model needs ({rank}, "
                              f"{in_features}) and ({out_features}, {rank})")  # fmt: skip
        matrices[module] = (a.t().float().contiguous(), b.t().float().contiguous())
    return matrices
