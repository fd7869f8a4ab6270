"""The events of a background response running on this replica, kept for every reader that follows it.

A background response's stream is not its creator's: the client that created it may go away and
come back (``GET /v1/responses/{id}?stream=true&starting_after=N``), and several may read it at
once. The runner appends each event as it is made; a reader replays the ones after its
``sequence_number`` and then waits for the next. Events are numbered from 0 in order, so an
event's index in the log is its ``sequence_number``. The log lives as long as its run: once the run
has ended, a reader rebuilds the events from the stored object (``server.api.responses.replay``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable


class EventLog:
    """One run's SSE events (``{"event", "data"}``) in order, and whether the run has ended."""

    def __init__(self) -> None:
        self.events: list[dict[str, str]] = []
        self.closed = False
        self._grown = asyncio.Event()  # set (and replaced) whenever an event is added or the log closes

    def extend(self, events: Iterable[dict[str, str]]) -> None:
        self.events.extend(events)
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        self._grown.set()
        self._grown = asyncio.Event()

    async def follow(self, after: int = -1) -> AsyncIterator[dict[str, str]]:
        """Every event with ``sequence_number`` > ``after``, then each new one until the run ends."""
        index = max(after + 1, 0)
        while True:
            while index < len(self.events):
                yield self.events[index]
                index += 1
            if self.closed:
                return
            await self._grown.wait()
