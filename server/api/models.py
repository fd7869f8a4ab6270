"""``GET /v1/models``: the served model, its assistants and its LoRA adapters (``parent``: the model an
adapter runs on, ``root``: where it was loaded from, as vLLM lists them), with what a client needs to
size requests."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from server.api.generation import engine_of
from server.http.auth import require_api_key
from server.output.envelope import now

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.get("/v1/models")
async def models(request: Request) -> dict:
    client = engine_of(request)
    created = now()
    data = [
        {
            "id": m.name,
            "object": "model",
            "created": created,
            "owned_by": "decoda",
            "role": m.role,
            "max_model_len": m.max_model_len,
            "context_length": m.max_model_len,
            "architecture": m.architecture,
            "model_type": m.model_type,
            "dtype": m.dtype,
            "quantization": m.quantization,
            "parent": m.parent,
            **({"root": m.root} if m.root is not None else {}),
        }  # fmt: skip
        for m in client.served_models()
    ]
    return {"object": "list", "data": data}
