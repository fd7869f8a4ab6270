"""A response's id carries its conversation's routing tag, so a load balancer keeps a conversation on one replica.

Ids are ``resp_`` and 32 hex digits. A response that starts a conversation gets random ones; one that
continues it (``previous_response_id``) keeps the first 16 of its predecessor's (the conversation's
tag) and draws the other 16. A router that hashes the tag of a request's ``previous_response_id``
(``deploy/nginx_session.js``) then sends every later turn of a conversation to the same replica,
whose prefix cache already holds the conversation's tokens; hashing the whole id would send each
turn somewhere new. The drawn half alone keeps ids unguessable (64 random bits), and an id sent by
a client in any other shape simply starts a new tag.
"""

from __future__ import annotations

import re
import secrets
import uuid

PREFIX = "resp_"
TAGGED = re.compile(r"resp_([0-9a-f]{16})[0-9a-f]{16}")


def response_id(previous_response_id: str | None = None) -> str:
    """A new response's id: its predecessor's tag and 16 random hex digits, else 32 random ones."""
    tagged = TAGGED.fullmatch(previous_response_id or "")
    if tagged is None:
        return f"{PREFIX}{uuid.uuid4().hex}"
    return f"{PREFIX}{tagged.group(1)}{secrets.token_hex(8)}"


def conversation_tag(response_id: str) -> str | None:
    """The routing tag of an id ``response_id`` made (what ``deploy/nginx_session.js`` hashes)."""
    tagged = TAGGED.fullmatch(response_id)
    return tagged.group(1) if tagged else None
