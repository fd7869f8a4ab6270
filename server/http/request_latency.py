"""Latency by priority and by caller: who waits, in two histograms each, under bounded labels.

The engine's own histograms (``server.http.metrics``) are labelled by strategy; whether priorities
and fair shares work is read per priority level and per caller. Each engine request is timed from its
submission to the engine (the engine's arrival time) to its first generated token reaching the HTTP
layer (time to first token) and to its last output (end to end); one observation per prompt, as the
engine's. A request the client left early, or that failed, is not observed end to end.

Labels stay bounded whatever clients send, so a scrape never grows with them:
- ``priority``: the request's ``priority`` (lower runs first) from -10 to 10, else ``<-10`` or ``>10``;
- ``caller``: the scheduler's name of the caller (``GenerationParams.caller``: ``key:`` and the start of
  the checked API key's digest, or ``user:<id>`` on a server without keys) when the server's
  configuration names it (its API keys, at most ``MAX_CALLER_LABELS``, and the callers of
  ``--caller-weights``), ``anonymous`` for a request nobody is named for, ``other`` for the rest (an end
  user the server was not configured with: a body's word is never a label).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable

from prometheus_client import CollectorRegistry, Histogram

from decoding import GenerationParams, RequestOutput
from server.http.metrics import E2E_BUCKETS, LATENCY_BUCKETS

PRIORITY_SPAN = 10  # priorities -10..10 are labelled as they are
ANONYMOUS = "anonymous"
MAX_CALLER_LABELS = 64  # configured callers labelled by name; any more are "other"
OTHER = "other"

METRIC_DOCS = {
    "decoda_time_to_first_token_by_priority_seconds": "submission to the first generated token (histogram; label "
    "priority: -10..10, else <-10 or >10)",
    "decoda_e2e_request_latency_by_priority_seconds": "submission to the last output (histogram; priority)",
    "decoda_time_to_first_token_by_caller_seconds": "submission to the first generated token (histogram; label "
    "caller: key:<digest start> for a configured API key, a --caller-weights name, anonymous, or other)",
    "decoda_e2e_request_latency_by_caller_seconds": "submission to the last output (histogram; caller)",
}


def priority_label(priority: int) -> str:
    if priority < -PRIORITY_SPAN:
        return f"<-{PRIORITY_SPAN}"
    if priority > PRIORITY_SPAN:
        return f">{PRIORITY_SPAN}"
    return str(priority)


class CallerLabels:
    """A caller's label: its name when ``names`` (the configured callers) holds it, else ``other``;
    ``anonymous`` for the one line of requests naming nobody."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.names = frozenset(list(dict.fromkeys(names))[:MAX_CALLER_LABELS])

    def label(self, caller: str) -> str:
        if not caller:
            return ANONYMOUS
        return caller if caller in self.names else OTHER


class RequestLatency:
    """The four histograms, in ``registry`` (the app's), and the stream wrapper that fills them."""

    def __init__(self, registry: CollectorRegistry, callers: CallerLabels | None = None) -> None:
        self.callers = callers or CallerLabels()

        def histogram(name: str, label: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, METRIC_DOCS[name], [label], buckets=buckets, registry=registry)

        self.ttft_by_priority = histogram("decoda_time_to_first_token_by_priority_seconds", "priority", LATENCY_BUCKETS)
        self.e2e_by_priority = histogram("decoda_e2e_request_latency_by_priority_seconds", "priority", E2E_BUCKETS)
        self.ttft_by_caller = histogram("decoda_time_to_first_token_by_caller_seconds", "caller", LATENCY_BUCKETS)
        self.e2e_by_caller = histogram("decoda_e2e_request_latency_by_caller_seconds", "caller", E2E_BUCKETS)

    def timed(self, stream: AsyncIterator[RequestOutput], params: GenerationParams) -> AsyncIterator[RequestOutput]:
        """``stream`` (one engine request, just submitted) observed into the histograms as it is read."""
        return TimedStream(stream, self, priority_label(params.priority), self.callers.label(params.caller))


class TimedStream:
    """An engine stream that times itself; iterating and ``aclose`` reach the stream it wraps."""

    def __init__(self, stream: AsyncIterator[RequestOutput], latency: RequestLatency, priority: str,
                 caller: str) -> None:  # fmt: skip
        self._stream = stream
        self._latency = latency
        self._labels = priority, caller
        self._submitted = time.monotonic()
        self._first_seen = False

    def __aiter__(self) -> TimedStream:
        return self

    async def __anext__(self) -> RequestOutput:
        output = await self._stream.__anext__()
        priority, caller = self._labels
        if not self._first_seen and any(delta.token_ids for delta in output.deltas):
            self._first_seen = True
            seconds = time.monotonic() - self._submitted
            self._latency.ttft_by_priority.labels(priority).observe(seconds)
            self._latency.ttft_by_caller.labels(caller).observe(seconds)
        if output.finished and output.error is None:
            seconds = time.monotonic() - self._submitted
            self._latency.e2e_by_priority.labels(priority).observe(seconds)
            self._latency.e2e_by_caller.labels(caller).observe(seconds)
        return output

    async def aclose(self) -> None:
        await self._stream.aclose()
