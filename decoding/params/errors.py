"""What a wrong request knob raises, and the ranges numeric knobs admit: the leaf every check imports.

``ParameterError`` carries the field's name exactly as the user sent it, which is what lets the
HTTP layer answer an OpenAI-style 400 naming the parameter; ``Bounds`` is one range written once,
enforced by ``validate`` and stated by ``/openapi.json`` from the same object.
"""

from __future__ import annotations

from dataclasses import dataclass


class ParameterError(ValueError):
    """A request knob is wrong; ``param`` names the field exactly as the user sent it."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_parameter") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code



@dataclass(frozen=True)
class Bounds:
    """The values a numeric knob admits; ``validate`` enforces them and ``/openapi.json`` states them."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def admits(self, value: float) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def describe(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {_number(self.low)}"
        left, right = ("(" if self.low_open else "["), (")" if self.high_open else "]")
        return f"in {left}{_number(self.low)}, {_number(self.high)}{right}"

    def json_schema(self) -> dict[str, float]:
        """JSON Schema (OpenAPI 3.1) keywords for these bounds."""
        out: dict[str, float] = {}
        if self.low is not None:
            out["exclusiveMinimum" if self.low_open else "minimum"] = self.low
        if self.high is not None:
            out["exclusiveMaximum" if self.high_open else "maximum"] = self.high
        return out


def _number(value: float) -> str:
    """Whole bounds exactly (a 64-bit seed's), others as short as they read (0.5, 1e-05)."""
    return str(value) if isinstance(value, int) else f"{value:g}"


def require(ok: bool, param: str, message: str) -> None:
    """Raise a ``ParameterError`` naming ``param`` unless ``ok``."""
    if not ok:
        raise ParameterError(message, param=param)
