"""Which folders a client may have the server load an adapter from: only folders under ``--lora-dir``.

A client names a path, the server reads it: without a fence, ``lora_path`` would let any API key
holder make the server open any folder it can read. The path is resolved with every symlink
followed (``Path.resolve(strict=True)``) and must land inside the resolved ``--lora-dir``, and so must
the two files the adapter is read from: a symlink that leaves the folder, at any level, is refused.
"""

from __future__ import annotations

from pathlib import Path

from decoding import ParameterError

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def adapter_folder(lora_dir: str | None, lora_path: str) -> Path:
    """The resolved adapter folder ``lora_path`` names under ``lora_dir``; a ParameterError otherwise."""
    if lora_dir is None:
        raise ParameterError("runtime LoRA loading is off: start the server with --enable-lora-loading and "
                             "--lora-dir FOLDER, whose adapter folders it may then load", param="lora_path",
                             code="lora_loading_disabled")  # fmt: skip
    fence = Path(lora_dir).resolve()
    named = Path(lora_path)
    candidate = named if named.is_absolute() else fence / named
    try:
        folder = candidate.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a symlink loop
        raise ParameterError(f"lora_path {lora_path!r}: no such folder under --lora-dir", param="lora_path",
                             code="lora_path_not_found") from None  # fmt: skip
    for path in (folder, *(folder / name for name in ADAPTER_FILES)):
        resolved = path.resolve()
        if resolved == fence or not resolved.is_relative_to(fence):
            raise ParameterError(f"lora_path {lora_path!r} leads outside --lora-dir (to {_shown(resolved, fence)}); "
                                 "only adapter folders inside it are loaded", param="lora_path",
                                 code="lora_path_forbidden")  # fmt: skip
    if not folder.is_dir():
        raise ParameterError(f"lora_path {lora_path!r} is not a folder", param="lora_path", code="lora_path_not_found")
    return folder


def _shown(path: Path, fence: Path) -> str:
    """What the refusal names: the folder itself, or 'a path outside it' (never the server's layout)."""
    return "--lora-dir itself" if path == fence else "a path outside it"
