"""The SQLite responses store's schema, version by version, and how a file of an older one is brought
to this one in place (``create_or_migrate``, in the caller's transaction).

Version 3 (``server.api.responses.store`` says why): ``responses`` holds one turn a row, its small
columns first (a read of its status never walks the JSON's overflow pages); ``responses_leases`` the
heartbeat of each unfinished response; ``responses_conversations`` how long each conversation (by its
first turn) is kept; ``responses_usage`` each owner's stored bytes and items, kept by triggers as rows
are inserted, rewritten and deleted.

Version 1 had no ``status`` and ``updated_at`` (filled from the JSON and ``created_at``); version 2
copied the whole conversation into every row: its rows keep that copy in ``conversation``
(each the start of its chain), their output moves to its own column, and their leases, conversations
and usage are made from them.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

SCHEMA_VERSION = 3
RESPONSES = """CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    expires_at REAL,
    status TEXT NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0,
    previous_id TEXT,
    root_id TEXT NOT NULL,
    turns INTEGER NOT NULL DEFAULT 1,
    bytes INTEGER NOT NULL DEFAULT 0,
    items INTEGER NOT NULL DEFAULT 0,
    response TEXT NOT NULL,
    input_items TEXT NOT NULL,
    output TEXT NOT NULL DEFAULT '[]',
    conversation TEXT
)"""
SIDE_TABLES = (
    "CREATE TABLE IF NOT EXISTS responses_leases (id TEXT PRIMARY KEY, renewed_at REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS responses_conversations (root_id TEXT PRIMARY KEY, keep_until REAL)",
    "CREATE TABLE IF NOT EXISTS responses_usage (owner TEXT PRIMARY KEY, bytes INTEGER NOT NULL, "
    "items INTEGER NOT NULL)",
)
TRIGGERS = (
    """CREATE TRIGGER IF NOT EXISTS usage_insert AFTER INSERT ON responses BEGIN
    INSERT OR IGNORE INTO responses_usage (owner, bytes, items) VALUES (NEW.owner, 0, 0);
    UPDATE responses_usage SET bytes = bytes + NEW.bytes, items = items + NEW.items WHERE owner = NEW.owner;
END""",
    """CREATE TRIGGER IF NOT EXISTS usage_delete AFTER DELETE ON responses BEGIN
    UPDATE responses_usage SET bytes = bytes - OLD.bytes, items = items - OLD.items WHERE owner = OLD.owner;
END""",
    """CREATE TRIGGER IF NOT EXISTS usage_update AFTER UPDATE OF bytes, items ON responses BEGIN
    UPDATE responses_usage SET bytes = bytes - OLD.bytes + NEW.bytes, items = items - OLD.items + NEW.items
    WHERE owner = NEW.owner;
END""",
)
INDEXES = (
    "CREATE INDEX IF NOT EXISTS responses_previous ON responses (previous_id)",
    "CREATE INDEX IF NOT EXISTS responses_root ON responses (root_id)",
    "CREATE INDEX IF NOT EXISTS leases_renewed ON responses_leases (renewed_at)",
    "CREATE INDEX IF NOT EXISTS conversations_expiry ON responses_conversations (keep_until)",
)
FROM_VERSION_2 = (
    "DROP INDEX IF EXISTS responses_expiry",
    "DROP INDEX IF EXISTS responses_unfinished",
    "ALTER TABLE responses RENAME TO responses_v2",
    RESPONSES,
    """INSERT INTO responses (id, owner, created_at, updated_at, expires_at, status, root_id, bytes, items, response,
                           input_items, output, conversation)
    SELECT id, owner, created_at, updated_at, expires_at, status, id,
           length(response) + length(input_items) + length(conversation),
           json_array_length(conversation) + coalesce(json_array_length(response, '$.output'), 0),
           json_set(response, '$.output', json('[]')), input_items, coalesce(json_extract(response, '$.output'), '[]'),
           conversation
    FROM responses_v2""",
    "DROP TABLE responses_v2",
    *SIDE_TABLES,
    "INSERT INTO responses_leases (id, renewed_at) SELECT id, updated_at FROM responses "
    "WHERE status IN ('queued', 'in_progress')",
    "INSERT INTO responses_conversations (root_id, keep_until) SELECT id, expires_at FROM responses",
    "INSERT INTO responses_usage (owner, bytes, items) SELECT owner, sum(bytes), sum(items) FROM responses "
    "GROUP BY owner",
)
MIGRATIONS = {  # version -> the statements that bring a file of that version to the next
    1: ("ALTER TABLE responses ADD COLUMN status TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE responses ADD COLUMN updated_at REAL NOT NULL DEFAULT 0",
        "UPDATE responses SET status = json_extract(response, '$.status'), updated_at = created_at"),
    2: FROM_VERSION_2,
}  # fmt: skip


def create_or_migrate(db: sqlite3.Connection, path: Path) -> None:
    """The schema made (a new file), checked (this version) or migrated (an older one), in the
    caller's transaction; a file of a newer version is refused rather than misread."""
    db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    version = db.execute("SELECT max(version) FROM schema_version").fetchone()[0]
    if version is None:
        for statement in (RESPONSES, *SIDE_TABLES):
            db.execute(statement)
        db.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
    elif version > SCHEMA_VERSION:
        raise RuntimeError(f"{path}: the responses store has schema version {version}; this Decoda reads "
                           f"version {SCHEMA_VERSION} (upgrade Decoda)")  # fmt: skip
    elif version < SCHEMA_VERSION:
        for older in range(version, SCHEMA_VERSION):
            for statement in MIGRATIONS[older]:
                db.execute(statement)
        db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
    for statement in TRIGGERS + INDEXES:
        db.execute(statement)
