"""Which responses store a server uses, by the scheme of ``--responses-store``, and closing it.

``sqlite:///PATH`` (the default: a file in the cache dir) is one replica's own file;
``postgresql://`` (or ``postgres://``) is a database every replica behind a load balancer shares.
The URL was checked at start (``Settings.check``); this only builds the store it names.
"""

from __future__ import annotations

import inspect

from server.api.responses.store import ResponseStore
from server.api.responses.store_postgres import PostgresResponseStore
from server.api.responses.store_sqlite import SqliteResponseStore
from server.config.settings import Settings
from server.config.store_url import POSTGRES_SCHEMES


def open_store(settings: Settings) -> ResponseStore:
    """The store ``settings`` names; it connects on first use, not here."""
    url = settings.responses_store_url()
    if url.partition("://")[0] in POSTGRES_SCHEMES:
        return PostgresResponseStore(url, settings.responses_ttl)
    return SqliteResponseStore(settings.responses_store_path(), settings.responses_ttl)


async def close_store(store: ResponseStore | None) -> None:
    """Close a store at shutdown, whether its ``close`` is plain (SQLite) or a coroutine (a pool)."""
    if store is not None:
        closing = store.close()
        if inspect.isawaitable(closing):
            await closing
