"""``decoda serve``: settings from flags, environment and config/server.yaml, then uvicorn."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from server.settings import add_arguments, load_settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="decoda", description="OpenAI-compatible server for HF decoding strategies")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="serve a model over the OpenAI API",
        description="Serve a model over the OpenAI API. Every flag also reads DECODA_<FLAG> and config/server.yaml.",
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
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import uvicorn

    from server.app import create_app

    # uvicorn drains on SIGTERM, then re-raises the signal it captured; with the default handler
    # that kills the process (exit -15). A no-op handler lets a drained server exit 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=int(settings.drain_timeout),
    )


if __name__ == "__main__":
    main()
