"""``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter``: vLLM's runtime adapter routes.

They exist only with ``--enable-lora-loading`` (vLLM registers them only with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``; without it they are 404s, as there), and with API keys only an
admin key (``--admin-api-key``) may call them: any other valid key gets a 403 naming why. Loading
reads only folders under ``--lora-dir`` (``paths``) and answers with the reason an adapter cannot be
served (a 400 naming ``lora_path``); the folder is read off the engine's thread and the engine swaps
the ready adapter in between two steps. Past ``--max-loaded-loras`` the least recently used idle
adapter is unloaded to make room; when every one has requests in flight the load is a 429 naming the
cap. Unloading an adapter that requests still use is refused with a 409 (they keep running on it;
retry once they finish): it never waits on a client's stream and never switches a running request
to other weights. Success is vLLM's plain-text line.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse

from decoding import LoraBusyError, LoraLimitError
from server.api.generation import engine_of
from server.api.lora.paths import adapter_folder
from server.api.lora.protocol import LoadLoraAdapterRequest, UnloadLoraAdapterRequest
from server.http.auth import require_admin_key
from server.http.errors import APIError

router = APIRouter(dependencies=[Depends(require_admin_key)])
RETRY_LOADING = "1"  # seconds: an adapter becomes idle as soon as its requests end


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
async def load_lora_adapter(body: LoadLoraAdapterRequest, request: Request) -> PlainTextResponse:
    client = engine_of(request)
    folder = adapter_folder(request.app.state.settings.lora_dir, body.lora_path)
    try:
        await client.load_lora_adapter(body.lora_name, str(folder))
    except LoraLimitError as full:
        raise APIError(429, str(full), type_="rate_limit_error", param="lora_name", code="lora_limit",
                       headers={"Retry-After": RETRY_LOADING}) from full  # fmt: skip
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
async def unload_lora_adapter(body: UnloadLoraAdapterRequest, request: Request) -> PlainTextResponse:
    client = engine_of(request)
    try:
        await client.unload_lora_adapter(body.lora_name)
    except LoraBusyError as busy:
        raise APIError(409, str(busy), param="lora_name", code="lora_in_use") from busy
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
