"""``--allowed-media-domains``: the hosts whose ``http(s)`` image URLs the server fetches.

By default there are none: a request's image comes in its body (a ``data:`` URL, a base64 block), and
the server never fetches an address a client chose (which would let any client make it reach hosts on
its own network). An operator who wants remote images names the hosts; an entry is a host name only
(``images.example.com``, matched exactly and case-insensitively against the URL's host, whatever its
port), so a URL, a path or a wildcard where a host name goes fails at start instead of matching nothing.
"""

from __future__ import annotations

import re

HOST_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")


def parse_media_domains(spec: str | None) -> tuple[str, ...]:
    """``"a.example.com, B.example.com"`` -> ``("a.example.com", "b.example.com")``; a ValueError names an
    entry that is no host name."""
    hosts = []
    for entry in (spec or "").split(","):
        host = entry.strip().lower().rstrip(".")
        if not entry.strip():
            continue
        if not HOST_NAME.match(host):
            raise ValueError(f"allowed_media_domains (--allowed-media-domains) takes host names (images.example.com), "
                             f"got {entry.strip()!r}")  # fmt: skip
        hosts.append(host)
    return tuple(dict.fromkeys(hosts))
