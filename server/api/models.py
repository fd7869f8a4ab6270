"""``GET /v1/models`` and ``GET /v1/models/{model_id}``: the served model, its assistants and its LoRA
adapters (``parent``: the model an adapter runs on, ``root``: where it was loaded from, as vLLM lists
them), with what a client needs to size requests. One entry reads the same in the list and alone
(OpenAI's model object: ``id``, ``object``, ``created``, ``owned_by``, then these facts); an id this
server does not serve is a 404 in OpenAI's shape, as a generation request naming it is."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from decoding import ServedModel
from server.api.generation import engine_of
from server.http.auth import require_api_key
from server.http.errors import APIError
from server.output.envelope import now

router = APIRouter(dependencies=[Depends(require_api_key)])


def model_object(model: ServedModel, created: int) -> dict[str, Any]:
    """One served model as OpenAI's model object, with the facts a client sizes requests by."""
    return {
        "id": model.name,
        "object": "model",
        "created": created,
        "owned_by": "decoda",
        "role": model.role,
        "max_model_len": model.max_model_len,
        "context_length": model.max_model_len,
        "architecture": model.architecture,
        "model_type": model.model_type,
        "dtype": model.dtype,
        "quantization": model.quantization,
        "task": model.task,
        "parent": model.parent,
        **({"root": model.root} if model.root is not None else {}),
    }


@router.get("/v1/models")
async def models(request: Request) -> dict:
    created = now()
    return {"object": "list", "data": [model_object(m, created) for m in engine_of(request).served_models()]}


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> dict:
    """One served model by its id (which may hold ``/``: a folder's name, an adapter's ``org/name``)."""
    served = engine_of(request).served_models()
    found = next((m for m in served if m.name == model_id), None)
    if found is None:
        names = ", ".join(f"'{m.name}'" for m in served)
        raise APIError(404, f"The model '{model_id}' does not exist; this server serves {names}", param="model",
                       code="model_not_found")  # fmt: skip
    return model_object(found, now())
