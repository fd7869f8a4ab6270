"""``GET /v1/custom_generate``: the custom decoding methods this server was started with.

A client picks one with ``"custom_generate": NAME`` and passes the listed ``arguments`` as extra
top-level fields (``decoding/custom_methods.py``); the list tells it which exist without reading
the server's command line.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from server.api.generation import engine_of
from server.http.auth import require_api_key

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.get("/v1/custom_generate", summary="List the registered custom decoding methods")
async def list_custom_generate(request: Request) -> dict:
    methods = engine_of(request).facts.custom_methods
    return {"object": "list", "data": [method.as_json() for method in methods]}
