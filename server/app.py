"""The FastAPI application: routes, error handlers, metrics, and the engine's life cycle.

The engine loads during startup (uvicorn serves nothing until it is ready, and a failed load
exits non-zero). On SIGTERM uvicorn stops accepting connections and ``decoda serve`` starts the
drain at once (``begin_drain``): no new requests (one that still arrives on an open keep-alive
connection gets a 503 with ``Retry-After`` before any work, which nginx retries on another
replica: ``deploy/nginx.conf``), in-flight ones may finish for ``drain_timeout``,
then the worker stops and whatever is still running ends with a 503 (an SSE error event for a
stream). uvicorn waits a little longer than that before it cuts connections itself, so clients
get the error rather than a dropped connection; then the lifespan ends and the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from decoding import EngineClient
from decoding.params.watermarking import WatermarkingConfig
from server.api import APIS
from server.api.openapi import install_openapi
from server.api.responses.stores import close_store
from server.config.caller_weights import key_name
from server.config.settings import Settings
from server.http.access_log import AccessLog
from server.http.auth import Identify, KeyRing, ProtectPaths, protected_paths
from server.http.counting import CountResponses
from server.http.errors import install_error_handlers
from server.http.limits import RequestLimits, UploadLimit
from server.http.metrics import Metrics
from server.http.metrics_vllm import VllmCompat
from server.http.request_latency import CallerLabels, RequestLatency
from server.output.streaming import close_remaining_streams, drain_streams_on_shutdown
from server.output.tool_parser import resolve_parser
from server.playground import playground_router
from server.translate.presets import load_presets

logger = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, engine_client: EngineClient | None = None) -> FastAPI:
    settings = settings or Settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if app.state.engine is None:
            from decoding.engine.prebuild import start_builds  # torch is imported only here

            config = settings.engine_config()
            # a first start's C++ builds run while the engine's modules import and its model loads
            start_builds(config)
            from decoding.engine.launch import start_engine_client

            app.state.engine = await asyncio.to_thread(start_engine_client, config, metrics)
            logger.info("serving %s on http://%s:%d", app.state.engine.model_name, settings.host, settings.port)
        # --tool-call-parser auto: the format the served chat template writes, said once at start
        settings.tool_call_parser, chosen = resolve_parser(
            settings.tool_call_parser, app.state.engine.chat_template_source()
        )
        logger.info(chosen)
        app.state.loop = asyncio.get_running_loop()
        try:
            yield
        finally:
            drain = start_drain(app)
            if drain is not None:
                await drain
                close_remaining_streams()
            # after the drain: a response finishing in it is still stored
            await close_store(getattr(app.state, "responses_store", None))

    app = FastAPI(
        title="Decoda",
        description="OpenAI-compatible server for every decoding strategy of HF generate()",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.keys = KeyRing.of(settings.api_keys(), settings.admin_api_keys())
    app.state.api_key_digests = app.state.keys.digests
    app.state.metrics = metrics
    app.state.request_latency = RequestLatency(metrics.registry, CallerLabels(configured_callers(settings)))
    if settings.metrics_compat == "vllm":  # vLLM's series beside Decoda's, for routers that read them
        metrics.registry.register(VllmCompat(metrics, lambda: getattr(app.state.engine, "model_name", None)))
    app.state.engine = engine_client
    app.state.owns_engine = engine_client is None  # an engine handed in (tests) is its owner's to stop
    app.state.loop = None
    app.state.drain = None
    drain_streams_on_shutdown()
    install_error_handlers(app)
    app.state.watermark = WatermarkingConfig.from_file(settings.watermark) if settings.watermark else None
    app.state.presets = load_presets(settings.presets_dir)  # a bad preset file fails the start
    for api in APIS:
        if api.enabled_by is None or getattr(settings, api.enabled_by):
            app.include_router(api.router)
    install_openapi(app)
    if settings.playground:  # the page at / (server/static/); --no-playground serves the API only
        app.include_router(playground_router())
    # add_middleware wraps what is there: the last added is the outermost
    if app.state.api_key_digests:
        app.add_middleware(ProtectPaths, keys=app.state.keys,
                           paths=protected_paths(settings.protect_metrics, settings.public_docs))  # fmt: skip
    app.add_middleware(RequestLimits, max_request_bytes=settings.max_request_bytes,
                       max_concurrency_per_key=settings.max_concurrency_per_key,
                       keyed=bool(app.state.api_key_digests), uploads=upload_limits(settings))  # fmt: skip
    app.add_middleware(Identify, keys=app.state.keys)  # one caller per request: limits, routes and logs read it
    app.add_middleware(AccessLog)  # its request id is on every answer, refusals included
    app.add_middleware(CountResponses, metrics=metrics, fastapi_app=app)  # outermost: sees every response
    return app


def upload_limits(settings: Settings) -> dict[str, UploadLimit]:
    """The routes whose body carries a file (``Api.uploads``) and the limit on it: their bodies may be that much
    larger than a JSON body."""
    return {path: UploadLimit.of(settings, param, setting)
            for api in APIS for path, (param, setting) in api.uploads.items()}  # fmt: skip


def configured_callers(settings: Settings) -> list[str]:
    """The callers the per-caller latency labels by name (``server.http.request_latency``): the weighted
    ones (``--caller-weights``, the keys file's ``weight=``), then every API key, by the scheduler's names."""
    return [*settings.caller_weights_table(), *(key_name(key) for key in settings.api_keys())]


def start_drain(app: FastAPI) -> asyncio.Task | None:
    """Drain the engine this app started, once: stop admitting, wait up to ``drain_timeout`` for
    in-flight requests, then stop the worker (what is left ends with a 503). On the event loop."""
    shutdown = getattr(app.state.engine, "shutdown", None)
    if app.state.drain is None and app.state.owns_engine and shutdown is not None:
        app.state.drain = asyncio.get_running_loop().create_task(shutdown(app.state.settings.drain_timeout))
    return app.state.drain


def begin_drain(app: FastAPI) -> None:
    """Start the drain from a signal handler (any thread): SIGTERM's deadline starts now."""
    loop = app.state.loop
    if loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(start_drain, app)
