"""A PostgreSQL database for the tests that need one, from ``DECODA_TEST_POSTGRES_URL``.

``.ci/run`` starts a throwaway cluster and exports the URL; without it those tests skip, saying so
(``make test``'s ``-rs`` lists the reason). Each test gets its own schema in that database (the URL's
``search_path``, which asyncpg passes to the server), dropped afterwards: tests never see each
other's tables, and the store's schema is created from nothing every time.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

POSTGRES_URL = os.environ.get("DECODA_TEST_POSTGRES_URL", "")
SKIP_REASON = "set DECODA_TEST_POSTGRES_URL (the .ci/run script starts a PostgreSQL cluster)"
needs_postgres = pytest.mark.skipif(not POSTGRES_URL, reason=SKIP_REASON)


async def execute(url: str, statement: str, *args: object) -> object:
    """One statement on a connection of its own; its ``fetch`` rows."""
    import asyncpg

    connection = await asyncpg.connect(url)
    try:
        return await connection.fetch(statement, *args)
    finally:
        await connection.close()


@contextmanager
def fresh_schema() -> Iterator[str]:
    """A URL of the test database whose tables land in a new, empty schema; dropped on exit."""
    schema = f"decoda_test_{uuid.uuid4().hex[:12]}"
    asyncio.run(execute(POSTGRES_URL, f"CREATE SCHEMA {schema}"))
    joiner = "&" if "?" in POSTGRES_URL else "?"
    try:
        yield f"{POSTGRES_URL}{joiner}search_path={schema}"
    finally:
        asyncio.run(execute(POSTGRES_URL, f"DROP SCHEMA {schema} CASCADE"))
