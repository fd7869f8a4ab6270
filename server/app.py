"""The FastAPI application: routes, error handlers, metrics, and the engine's life cycle.

The engine loads during startup (uvicorn serves nothing until it is ready, and a failed load
exits non-zero). On SIGTERM uvicorn stops accepting connections, lets in-flight requests finish
up to ``drain_timeout``, then the lifespan drains and stops the worker, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from decoding import EngineClient
from server.errors import install_error_handlers
from server.metrics import Metrics
from server.routes import api, router
from server.settings import Settings
from server.streaming import close_remaining_streams, drain_streams_on_shutdown

logger = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, engine_client: EngineClient | None = None) -> FastAPI:
    settings = settings or Settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if app.state.engine is None:
            from decoding.launch import start_engine_client  # torch is imported only here

            app.state.engine = await asyncio.to_thread(start_engine_client, settings.engine_config(), metrics)
            logger.info("serving %s on http://%s:%d", app.state.engine.model_name, settings.host, settings.port)
        try:
            yield
        finally:
            client = app.state.engine
            shutdown = getattr(client, "shutdown", None)
            if shutdown is not None and engine_client is None:
                await shutdown(settings.drain_timeout)
                close_remaining_streams()

    app = FastAPI(
        title="Decoda",
        description="OpenAI-compatible server for every decoding strategy of HF generate()",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.engine = engine_client
    drain_streams_on_shutdown()
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(api)
    return app
