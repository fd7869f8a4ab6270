"""The ``POST /v1/watermark/detect`` body: the ids or the text to score, and the config to score them with."""

from __future__ import annotations

from server.translate.strict import Strict
from server.translate.watermark import WatermarkingConfigBody


class WatermarkDetectRequest(Strict):
    """``POST /v1/watermark/detect``: give ``token_ids`` (exact) or ``text`` (tokenized by the served
    model's tokenizer, without special tokens); the config defaults to the server's ``--watermark``."""

    model: str | None = None
    token_ids: list[int] | None = None
    text: str | None = None
    watermarking_config: WatermarkingConfigBody | None = None
    z_threshold: float = 3.0
    ignore_repeated_ngrams: bool = False
