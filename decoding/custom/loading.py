"""Loading custom decoding methods at start, with transformers' own loader.

``decoda serve --custom-generate NAME=PATH`` points at a local folder in the layout of HF's
``custom_generate`` repositories (``PATH/custom_generate/generate.py``, optional
``requirements.txt``), used from disk as HF's docs recommend while developing a method. Loading
reuses ``GenerationMixin.load_custom_generate`` (its module cache, its trust gate) and
``check_python_requirements`` (its wording for unmet requirements), after Decoda's own refusal
without ``--trust-remote-code``; ``preflight`` runs the checks that need no model before it loads.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers.dynamic_module_utils import check_python_requirements

from decoding.params.custom_methods import RESERVED_ARGUMENTS, CustomMethodInfo, require_trust

logger = logging.getLogger(__name__)

REQUIREMENTS_FILE = "custom_generate/requirements.txt"  # where HF's load_custom_generate looks


@dataclass
class LoadedMethod:
    info: CustomMethodInfo
    function: Callable[..., object]
    takes_streamer: bool
    takes_stopping_criteria: bool


def preflight(specs: list[tuple[str, str]], trust_remote_code: bool) -> None:
    """What can fail before the model loads: the trust flag, the files, transformers' requirement check."""
    require_trust(specs, trust_remote_code)
    for name, path in specs:
        try:
            check_python_requirements(str(Path(path).resolve()), requirements_file=REQUIREMENTS_FILE)
        except ImportError as exc:
            raise ImportError(f"--custom-generate {name}={path}: {exc}") from exc


def load_custom_methods(
    specs: list[tuple[str, str]], trust_remote_code: bool, model: torch.nn.Module
) -> dict[str, LoadedMethod]:
    """Load each ``NAME=PATH`` with transformers' loader; unmet requirements raise its ImportError."""
    preflight(specs, trust_remote_code)
    methods = {}
    for name, path in specs:
        try:
            function = model.load_custom_generate(str(Path(path).resolve()), trust_remote_code=True)
        except ImportError as exc:
            raise ImportError(f"--custom-generate {name}={path}: {exc}") from exc
        methods[name] = describe(name, path, function)
        logger.info("custom_generate %s loaded from %s (arguments: %s)", name, path, methods[name].info.arguments)
    return methods


def describe(name: str, path: str, function: Callable[..., object]) -> LoadedMethod:
    """What a request may pass (named keyword parameters) and which of HF's helpers the method takes."""
    parameters = inspect.signature(function).parameters
    has_var_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    for needed in ("model", "input_ids"):
        if needed not in parameters:
            raise ValueError(f"--custom-generate {name}={path}: generate() must take `{needed}` (HF's signature "
                             "is generate(model, input_ids, generation_config=None, **kwargs))")  # fmt: skip
    arguments = tuple(
        n for n, p in parameters.items()
        if n not in RESERVED_ARGUMENTS and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    )  # fmt: skip
    doc = (inspect.getdoc(function) or "").strip().splitlines()
    info = CustomMethodInfo(name, str(path), arguments, doc[0] if doc else "")
    return LoadedMethod(
        info,
        function,
        takes_streamer=has_var_kwargs or "streamer" in parameters,
        takes_stopping_criteria=has_var_kwargs or "stopping_criteria" in parameters,
    )
