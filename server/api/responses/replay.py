"""A background response's event stream rebuilt from its stored object, for a stream resumed once its
run has ended, on another replica, or after a restart.

The events are made by the live stream's own code (``ResponseEvents``) from the final object, so
they read as the live ones did, sequence numbers included, on one condition: the text deltas must be
cut where the live ones were. The final object cannot say where (OpenAI's shape has no place for it),
so the stored row carries it beside the response under ``RECORD``, a key no client sees
(``public``): whether the runner started (a response cancelled while queued never went
``in_progress``), whether the deltas carried logprobs, and each text delta's characters and logprob
entries per output item. A row without it (its replica stopped before the end) is replayed with
one delta per message.
"""

from __future__ import annotations

from typing import Any

from server.api.responses.events import ResponseEvents
from server.api.responses.format import ResponseBuilder

RECORD = "_decoda_stream"  # the stored object's private key: how its events went out
OWN_FIELDS = ("id", "object", "created_at", "status", "error", "incomplete_details", "model", "output", "usage")


def public(response: dict[str, Any]) -> dict[str, Any]:
    """The response object a client sees: the stored one without its record."""
    return {key: value for key, value in response.items() if key != RECORD}


def recorded(response: dict[str, Any], events: ResponseEvents, started: bool) -> dict[str, Any]:
    """The final object as stored: with how its events went out."""
    deltas = [events.deltas.get(index, []) for index in range(len(response["output"]))]
    return {**response, RECORD: {"started": started, "logprobs": events.builder.logprobs, "deltas": deltas}}


def replayed_events(stored: dict[str, Any]) -> list[dict[str, str]]:
    """Every event of the finished background response ``stored`` (a stored object, record included)."""
    response = public(stored)
    record = stored.get(RECORD) or {}
    echo = {key: value for key, value in response.items() if key not in OWN_FIELDS}
    logprobs = record.get("logprobs", any("logprobs" in part for item in response["output"]
                                          for part in item.get("content", [])))  # fmt: skip
    builder = ResponseBuilder(response["id"], response["model"], echo, logprobs=logprobs,
                              created_at=response["created_at"])  # fmt: skip
    events = ResponseEvents(builder)
    out = events.queued()
    if record.get("started", True):
        out += events.in_progress()
    deltas = record.get("deltas", [])
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            out += events.replay_message(item, deltas[index] if index < len(deltas) else None)
        elif item["type"] == "reasoning":
            out += events.replay_reasoning(item, deltas[index] if index < len(deltas) else None)
        else:
            out += events.replay_call(item)
    out.append(events.final_event(response))
    return out
