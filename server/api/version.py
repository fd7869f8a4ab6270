"""``GET /version``: the server's version, as vLLM answers it (``{"version": ...}``).

Open like ``/health`` (no API key: it names the software, not the model or its limits) and answering
while the model loads, so a deploy script can check which release a replica runs before it is ready.
The version is the installed ``decoda`` distribution's (``pyproject.toml``)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fastapi import APIRouter

router = APIRouter()


def decoda_version() -> str:
    try:
        return version("decoda")
    except PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


@router.get("/version")
async def server_version() -> dict[str, str]:
    return {"version": decoda_version()}
