"""End-to-end servers shared by the whole test session: one ``decoda serve`` per distinct set of flags.

Each start loads SmolLM2 and warms it up (seconds to tens of seconds on a busy 2-core machine), so
modules that need the same server ask ``conftest.shared_server(*flags)`` for it instead of starting
their own: the first module to ask starts it, later ones get the same process, and the session's end
stops it. A module that uses one must not depend on a fresh server's state (metric counts, an empty
cache, stored responses): it reads a counter before and after instead. A module whose tests kill,
drain or restart their server, or whose flags change what every request gets, keeps its own.

Every shared server writes to a log file, never a pipe (a server answering a whole session's
requests would fill a pipe nobody reads and block on its access log), and gets its own Responses
store in the session's temporary folder unless its flags name one (not the user's cache dir).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

# The plain server most end-to-end modules share: the embedded model, nothing that changes a reply.
PLAIN_MAX_MODEL_LEN = 2048
PLAIN = ("--max-model-len", str(PLAIN_MAX_MODEL_LEN))


class SharedServers:
    """The session's running servers by their flags; ``stop_all`` at the session's end."""

    def __init__(self, folder: Path, ready_s: float = 120) -> None:
        """``ready_s``: how long a start may take (a 1.5B model's load takes longer than SmolLM2's)."""
        self.folder = folder
        self.ready_s = ready_s
        self.running: dict[tuple[str, ...], tuple[str, subprocess.Popen, Path]] = {}

    def base_url(self, *flags: str) -> str:
        """The base URL of the server started with ``flags``, started now if none is running yet."""
        if flags not in self.running:
            self.running[flags] = self._start(flags)
        base, proc, log = self.running[flags]
        if proc.poll() is not None:  # a test killed it or it crashed: say so rather than time out later
            raise AssertionError(f"the shared server {flags} exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        return base

    def _start(self, flags: tuple[str, ...]) -> tuple[str, subprocess.Popen, Path]:
        from tests.test_e2e_openai import start_server

        number = len(self.running)
        log = self.folder / f"server-{number}.log"
        store = ("--responses-store", f"sqlite:///{self.folder / f'responses-{number}.db'}")
        if "--responses-store" in flags:
            store = ()
        base, proc = start_server(*flags, *store, log=log, ready_s=self.ready_s)
        return base, proc, log

    def stop_all(self) -> None:
        from tests.test_e2e_openai import stop_server

        for _, proc, _ in self.running.values():
            stop_server(proc)
        self.running.clear()
