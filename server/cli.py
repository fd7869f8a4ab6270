"""``decoda serve``: settings from flags, environment and config/server.yaml, then uvicorn."""

from __future__ import annotations

import argparse
import logging
import math
import signal
import sys
from types import FrameType

from server.config.sources import add_arguments, config_path, load_settings
from server.http.access_log import configure_logging

logger = logging.getLogger(__name__)

DRAIN_MARGIN = 5  # seconds uvicorn waits beyond drain_timeout: the worker's last outputs reach their clients


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="decoda", description="OpenAI-compatible server for HF decoding strategies")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="serve a model over the OpenAI API",
        description="Serve a model over the OpenAI API. Every flag also reads DECODA_<FLAG> and the config file "
        "(--config, else ./config/server.yaml, else the one installed with Decoda).",
    )
    add_arguments(serve)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(args)
    except ValueError as exc:
        print(f"decoda: {exc}", file=sys.stderr)
        sys.exit(2)
    configure_logging(settings.log_level, settings.log_format)
    logger.info("settings file: %s", config_path(args) or "none (built-in defaults)")
    import uvicorn

    from server.app import begin_drain, create_app

    class DrainingServer(uvicorn.Server):
        """uvicorn's server, which also starts the app's drain the moment a signal asks it to exit."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            begin_drain(app)
            super().handle_exit(sig, frame)

    try:
        app = create_app(settings)
    except ValueError as exc:  # e.g. a preset file that cannot be served: name it, exit like a bad flag
        print(f"decoda: {exc}", file=sys.stderr)
        sys.exit(2)
    # uvicorn drains on SIGTERM, then re-raises the signal it captured; with the default handler
    # that kills the process (exit -15). A no-op handler lets a drained server exit 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # uvicorn's records go to our root handler (text or JSON)
        access_log=False,  # server.http.access_log writes one line per request, with its request id
        # past the app's own deadline, so requests still running end with a 503, not a cut connection
        timeout_graceful_shutdown=math.ceil(settings.drain_timeout) + DRAIN_MARGIN,
    )
    DrainingServer(config).run()


if __name__ == "__main__":
    main()
