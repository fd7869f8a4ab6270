"""``GET /v1/presets``: the named generation presets a request may pick with ``generation_preset``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from server.http.auth import require_api_key
from server.translate.presets import presets_of

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.get("/v1/presets")
async def list_presets(request: Request) -> dict[str, Any]:
    """The named generation presets a request may pick with ``generation_preset``."""
    return presets_of(request).listing()
