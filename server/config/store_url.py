"""The shape of a PostgreSQL ``--responses-store`` URL, checked at start, and the URL shown without its password.

libpq's URL form, as asyncpg reads it: ``postgresql://[USER[:PASSWORD]@]HOST[:PORT][,HOST[:PORT]...]/DATABASE
[?PARAM=VALUE...]`` (``postgres://`` too; a ``host=`` parameter may name a Unix socket folder instead of
a host). A typo (one slash, a port that is not a number, no database) fails ``decoda serve`` before the
model loads rather than every stored request afterwards.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

POSTGRES_SCHEMES = ("postgresql", "postgres")
POSTGRES_URL_SHAPE = "postgresql://USER:PASSWORD@HOST:PORT/DATABASE"


def postgres_url_problem(url: str) -> str | None:
    """What is wrong with a PostgreSQL URL's shape, or None."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    hosts = parts.netloc.rpartition("@")[2]
    if not hosts and "host" not in query:
        return "names no host"
    for host in filter(None, hosts.split(",")):
        name, _, port = host.rpartition(":") if ":" in host.rpartition("]")[2] else (host, "", "")
        if not name or (port and not (port.isdigit() and 0 < int(port) < 65536)):
            return f"has a bad host or port {host!r}"
    database = parts.path.removeprefix("/")
    if not database and "dbname" not in query:
        return "names no database"
    if "/" in database:
        return f"has a bad database name {database!r}"
    return None


def redacted_url(url: str) -> str:
    """The URL with its password replaced by ``***``, for messages and logs."""
    return re.sub(r"^([^:/]+://[^:/@]*):[^@/]*@", r"\1:***@", url)
