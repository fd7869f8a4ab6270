"""``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter``: vLLM's runtime adapter routes.

Behind the API keys like every ``/v1/*`` route. Loading reads only folders under ``--lora-dir``
(``paths``) and answers with the reason an adapter cannot be served (a 400 naming ``lora_path``);
the engine reads it between two steps. Unloading an adapter that requests still use is refused
with a 409 (they keep running on it; retry once they finish): it never waits on a client's stream
and never switches a running request to other weights. Success is vLLM's plain-text line.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse

from decoding import LoraBusyError
from server.api.generation import engine_of
from server.api.lora.paths import adapter_folder
from server.api.lora.protocol import LoadLoraAdapterRequest, UnloadLoraAdapterRequest
from server.http.auth import require_api_key
from server.http.errors import APIError

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
async def load_lora_adapter(body: LoadLoraAdapterRequest, request: Request) -> PlainTextResponse:
    client = engine_of(request)
    folder = adapter_folder(request.app.state.settings.lora_dir, body.lora_path)
    await client.load_lora_adapter(body.lora_name, str(folder))
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
async def unload_lora_adapter(body: UnloadLoraAdapterRequest, request: Request) -> PlainTextResponse:
    client = engine_of(request)
    try:
        await client.unload_lora_adapter(body.lora_name)
    except LoraBusyError as busy:
        raise APIError(409, str(busy), param="lora_name", code="lora_in_use") from busy
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
