"""``GET /v1/models`` and ``GET /v1/models/{model_id}``: the served model, its assistants and its LoRA
adapters (``parent``: the model an adapter runs on, ``root``: where it was loaded from, as vLLM lists
them), with what a client needs to size requests. One entry reads the same in the list and alone
(OpenAI's model object: ``id``, ``object``, ``created``, ``owned_by``, then these facts); an id this
server does not serve is a 404 in OpenAI's shape, as a generation request naming it is.

``input_modalities`` (OpenRouter's name) says what a model reads: ``["text", "image"]`` for a
vision-language model (chat, Responses and Messages take its image parts; an adapter runs on it and reads
the same), ``["audio"]`` for a speech model (the audio API), ``["text"]`` otherwise (an assistant is a
text drafter). The playground shows its image button from it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from decoding import ServedModel
from server.api.generation import engine_of
from server.http.auth import require_api_key
from server.http.errors import APIError
from server.output.envelope import now

router = APIRouter(dependencies=[Depends(require_api_key)])


def input_modalities(model: ServedModel, takes_images: bool) -> list[str]:
    """What ``model`` reads; ``takes_images``: the served target model's ``ModelFacts.takes_images``."""
    if model.task == "automatic-speech-recognition":
        return ["audio"]
    return ["text", "image"] if takes_images and model.role != "assistant" else ["text"]


def model_object(model: ServedModel, created: int, takes_images: bool = False) -> dict[str, Any]:
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
        "input_modalities": input_modalities(model, takes_images),
        "parent": model.parent,
        **({"root": model.root} if model.root is not None else {}),
    }


@router.get("/v1/models")
async def models(request: Request) -> dict:
    created, client = now(), engine_of(request)
    images = client.facts.takes_images
    return {"object": "list", "data": [model_object(m, created, images) for m in client.served_models()]}


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> dict:
    """One served model by its id (which may hold ``/``: a folder's name, an adapter's ``org/name``)."""
    client = engine_of(request)
    served = client.served_models()
    found = next((m for m in served if m.name == model_id), None)
    if found is None:
        names = ", ".join(f"'{m.name}'" for m in served)
        raise APIError(404, f"The model '{model_id}' does not exist; this server serves {names}", param="model",
                       code="model_not_found")  # fmt: skip
    return model_object(found, now(), client.facts.takes_images)
