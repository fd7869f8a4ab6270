"""``watermarking_config``, a generation field of every API, and the server's default (``--watermark``).

``watermarking_config`` takes transformers' ``WatermarkingConfig`` fields by their HF names. It is
checked by ``decoding.params.watermarking`` before pydantic sees it, so an unknown key, a wrong type or
a value out of range is a 400 naming ``watermarking_config.<field>``, the allowed values and the
value; the bounds also go into ``/openapi.json`` from the same table.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import Request
from pydantic import Field, model_validator

from decoding import GenerationParams
from decoding.params.watermarking import WATERMARK_BOUNDS, WatermarkingConfig
from server.translate.strict import Strict

DEFAULTS = WatermarkingConfig()


def _bounded(name: str) -> Any:  # noqa: ANN401 - a pydantic FieldInfo
    return Field(getattr(DEFAULTS, name), json_schema_extra=WATERMARK_BOUNDS[name].json_schema())


class WatermarkingConfigBody(Strict):
    """transformers' ``WatermarkingConfig`` (Kirchenbauer et al. 2023), HF's defaults."""

    greenlist_ratio: float = _bounded("greenlist_ratio")
    bias: float = _bounded("bias")
    hashing_key: int = _bounded("hashing_key")
    seeding_scheme: Literal["lefthash", "selfhash"] = DEFAULTS.seeding_scheme
    context_width: int = _bounded("context_width")

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:  # noqa: ANN401
        if isinstance(data, WatermarkingConfigBody):  # already checked (a preset or a copy handing it on)
            data = data.model_dump()
        config = WatermarkingConfig.from_dict(data)  # ParameterError naming watermarking_config.<field>
        return {**config.to_dict(), "greenlist_ratio": float(config.greenlist_ratio), "bias": float(config.bias)}

    def config(self) -> WatermarkingConfig:
        return WatermarkingConfig(**self.model_dump())


def server_watermark(request: Request) -> WatermarkingConfig | None:
    """The ``--watermark`` config, read and checked once when the app was built."""
    return getattr(request.app.state, "watermark", None)


def with_server_watermark(request: Request, params: GenerationParams) -> GenerationParams:
    """A request that names no ``watermarking_config`` gets the server's (request > server default)."""
    default = server_watermark(request)
    if params.watermarking_config is None and default is not None:
        return params.replace(watermarking_config=default)
    return params
