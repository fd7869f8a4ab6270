"""A real uvicorn serving an app built in the test's own process (a thread), for tests whose engine is
a fake one they steer (gates, scripted replies) but whose clients need a real socket."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def uvicorn_in_thread(app: object, seconds: float = 30) -> Iterator[str]:
    """Serve ``app`` on a free loopback port until the block ends; yields its base URL."""
    import uvicorn

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + seconds
    while not server.started:
        assert time.monotonic() < deadline, f"the server did not start in {seconds} s"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(seconds)
