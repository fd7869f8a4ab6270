"""What an orchestrator and a scraper read: ``/health`` (liveness), ``/ready`` (readiness), ``/metrics``.

Always open (``/metrics`` needs a key only with ``--protect-metrics``, enforced by the guard in
``server.http.auth``), and answering while the model loads.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from server.http.metrics import CONTENT_TYPE

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> Response:
    """Liveness: red once the worker thread is gone or blocked, so an orchestrator restarts the replica."""
    client = getattr(request.app.state, "engine", None)
    if client is not None and not client.is_alive():
        return JSONResponse({"status": "worker stopped"}, status_code=503)
    stuck = client.stuck() if client is not None else None
    if stuck:
        return JSONResponse({"status": "worker blocked", "reason": stuck}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/ready")
async def ready(request: Request) -> Response:
    client = getattr(request.app.state, "engine", None)
    if client is not None and client.is_ready():
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "not ready"}, status_code=503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE)
