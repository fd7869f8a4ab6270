"""A request's (or the server's) watermark settings: transformers' ``WatermarkingConfig``, torch-free.

Kirchenbauer et al. 2023, "A Watermark for Large Language Models" (https://arxiv.org/abs/2301.10226),
as transformers implements it (``WatermarkingConfig`` / ``WatermarkLogitsProcessor`` /
``WatermarkDetector``). The fields and defaults are HF's. This module holds only the settings and
their validation, so the HTTP layer can build and check them without torch; the processor and the
detector are ``decoding.sampling.watermark``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from decoding.params.errors import Bounds, ParameterError

SEEDING_SCHEMES = ("lefthash", "selfhash")
MAX_HASHING_KEY = 2**63 - 1  # HF multiplies the key into int64 tensors (selfhash): it must fit one
# what each numeric field admits; ``/openapi.json`` states the same bounds
WATERMARK_BOUNDS: dict[str, Bounds] = {
    "greenlist_ratio": Bounds(0, 1, low_open=True, high_open=True),  # HF's own check
    "bias": Bounds(0, 100),  # HF takes any float; below 0 it would hide the watermark, past 100 it is the text
    "hashing_key": Bounds(0, MAX_HASHING_KEY),
    "context_width": Bounds(1, 1024),
}


@dataclass(frozen=True)
class WatermarkingConfig:
    """HF's ``WatermarkingConfig`` fields and defaults (the key is HF's default: the millionth prime;
    a deployment should pick its own, as HF advises)."""

    greenlist_ratio: float = 0.25
    bias: float = 2.0
    hashing_key: int = 15485863
    seeding_scheme: str = "lefthash"
    context_width: int = 1

    def validate(self, param: str = "watermarking_config") -> None:
        """Raise ``ParameterError`` naming ``{param}.{field}``, the allowed values and the value."""
        for name in ("greenlist_ratio", "bias"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ParameterError(f"{param}.{name} must be a number, got {value!r}", param=f"{param}.{name}")
        for name in ("hashing_key", "context_width"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ParameterError(f"{param}.{name} must be an integer, got {value!r}", param=f"{param}.{name}")
        for name, bounds in WATERMARK_BOUNDS.items():
            value = getattr(self, name)
            if not bounds.admits(value):
                raise ParameterError(
                    f"{param}.{name} must be {bounds.describe()}, got {value}", param=f"{param}.{name}"
                )
        if self.seeding_scheme not in SEEDING_SCHEMES:
            raise ParameterError(
                f'{param}.seeding_scheme must be "lefthash" or "selfhash", got {self.seeding_scheme!r}',
                param=f"{param}.seeding_scheme",
            )

    @classmethod
    def from_dict(cls, data: Any, param: str = "watermarking_config") -> WatermarkingConfig:
        """A validated config from JSON-like data; unknown keys are errors, never ignored."""
        if not isinstance(data, dict):
            raise ParameterError(f"{param} must be an object, got {data!r}", param=param)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ParameterError(
                f"{param} has unknown field {unknown[0]!r}; known: {', '.join(sorted(known))}",
                param=f"{param}.{unknown[0]}",
            )
        config = cls(**data)
        config.validate(param)
        return config

    @classmethod
    def from_file(cls, path: str | Path) -> WatermarkingConfig:
        """The server default (``--watermark FILE.json``); any problem is a ValueError naming the file
        and the field, so a bad file stops the server at start."""
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise ValueError(f"watermark file {path}: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"watermark file {path}: not JSON ({exc})") from None
        try:
            return cls.from_dict(data, param="watermarking_config")
        except ParameterError as exc:
            raise ValueError(f"watermark file {path}: {exc.message}") from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
