"""The PostgreSQL responses store's schema: the tables of ``sqlite_schema`` (version 3, column for
column, JSON in ``jsonb``), made once by the first replica that opens a new database, or brought from
version 2 in place (its rows keep their copied conversation, as in SQLite), in one transaction under
an advisory lock so that replicas starting together neither race on ``CREATE TABLE`` nor migrate
twice. A database written by a newer schema is refused rather than misread. The owners' usage is
kept by a trigger as rows are inserted, rewritten and deleted.
"""

from __future__ import annotations

import asyncpg

SCHEMA_VERSION = 3  # store.py's layout, as sqlite_schema.SCHEMA_VERSION 3
SCHEMA_LOCK = 0x6465636F646172  # pg_advisory_xact_lock's key for creating the schema ("decodar")
RESPONSES = """CREATE TABLE responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION,
    status TEXT NOT NULL,
    deleted BOOLEAN NOT NULL DEFAULT false,
    previous_id TEXT,
    root_id TEXT NOT NULL,
    turns INTEGER NOT NULL DEFAULT 1,
    bytes BIGINT NOT NULL DEFAULT 0,
    items BIGINT NOT NULL DEFAULT 0,
    response JSONB NOT NULL,
    input_items JSONB NOT NULL,
    output JSONB NOT NULL DEFAULT '[]',
    conversation JSONB
)"""
FROM_VERSION_2 = (
    "ALTER TABLE responses ADD COLUMN deleted BOOLEAN NOT NULL DEFAULT false, ADD COLUMN previous_id TEXT, "
    "ADD COLUMN root_id TEXT, ADD COLUMN turns INTEGER NOT NULL DEFAULT 1, ADD COLUMN bytes BIGINT NOT NULL "
    "DEFAULT 0, ADD COLUMN items BIGINT NOT NULL DEFAULT 0, ADD COLUMN output JSONB NOT NULL DEFAULT '[]', "
    "ALTER COLUMN conversation DROP NOT NULL",
    "UPDATE responses SET root_id = id, output = coalesce(response -> 'output', '[]'), response = jsonb_set(response, "
    "'{output}', '[]'), bytes = octet_length(response::text) + octet_length(input_items::text) + "
    "octet_length(conversation::text), items = jsonb_array_length(conversation) + "
    "jsonb_array_length(coalesce(response -> 'output', '[]'))",
    "ALTER TABLE responses ALTER COLUMN root_id SET NOT NULL",
    "DROP INDEX IF EXISTS responses_expiry",
    "DROP INDEX IF EXISTS responses_unfinished",
)
SIDE_TABLES = (
    "CREATE TABLE responses_leases (id TEXT PRIMARY KEY, renewed_at DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE responses_conversations (root_id TEXT PRIMARY KEY, keep_until DOUBLE PRECISION)",
    "CREATE TABLE responses_usage (owner TEXT PRIMARY KEY, bytes BIGINT NOT NULL, items BIGINT NOT NULL)",
)
FILL_SIDE_TABLES = (
    "INSERT INTO responses_leases (id, renewed_at) SELECT id, updated_at FROM responses "
    "WHERE status IN ('queued', 'in_progress')",
    "INSERT INTO responses_conversations (root_id, keep_until) SELECT id, expires_at FROM responses",
    "INSERT INTO responses_usage (owner, bytes, items) SELECT owner, sum(bytes), sum(items) FROM responses "
    "GROUP BY owner",
)
USAGE_TRIGGER = (
    """CREATE OR REPLACE FUNCTION responses_count_usage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        UPDATE responses_usage SET bytes = bytes - OLD.bytes, items = items - OLD.items WHERE owner = OLD.owner;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        INSERT INTO responses_usage AS u (owner, bytes, items) VALUES (NEW.owner, NEW.bytes, NEW.items)
        ON CONFLICT (owner) DO UPDATE SET bytes = u.bytes + excluded.bytes, items = u.items + excluded.items;
    END IF;
    RETURN NULL;
END $$""",
    "CREATE TRIGGER responses_count_usage AFTER INSERT OR DELETE OR UPDATE OF bytes, items ON responses "
    "FOR EACH ROW EXECUTE FUNCTION responses_count_usage()",
)
INDEXES = (
    "CREATE INDEX IF NOT EXISTS responses_previous ON responses (previous_id)",
    "CREATE INDEX IF NOT EXISTS responses_root ON responses (root_id)",
    "CREATE INDEX IF NOT EXISTS responses_leases_renewed ON responses_leases (renewed_at)",
    "CREATE INDEX IF NOT EXISTS responses_conversations_expiry ON responses_conversations (keep_until)",
)


async def create_schema(connection: asyncpg.Connection) -> None:
    """Make, check or migrate the tables, in the caller's transaction, one replica at a time."""
    await connection.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
    await connection.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    version = await connection.fetchval("SELECT max(version) FROM schema_version")
    if version is not None and version > SCHEMA_VERSION:  # checked before any DDL touches a newer layout
        raise RuntimeError(f"the PostgreSQL responses store has schema version {version}; this Decoda reads "
                           f"version {SCHEMA_VERSION} (upgrade Decoda)")  # fmt: skip
    if version == SCHEMA_VERSION:
        return
    if version is None:
        statements = (RESPONSES, *SIDE_TABLES)
        await connection.execute("INSERT INTO schema_version (version) VALUES ($1)", SCHEMA_VERSION)
    else:  # version 2: the only older one a PostgreSQL store had
        statements = (*FROM_VERSION_2, *SIDE_TABLES, *FILL_SIDE_TABLES)
        await connection.execute("UPDATE schema_version SET version = $1", SCHEMA_VERSION)
    for statement in (*statements, *USAGE_TRIGGER, *INDEXES):
        await connection.execute(statement)
