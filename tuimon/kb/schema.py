"""The database schema, as an ordered list of migrations (sqlite-utils ``Migrations``).

A knowledge base lives for years and is opened by whatever tuimon version each engineer has, so
the schema only moves forward by named migrations, applied once under the write lock. A database
that has migrations this tuimon does not know was written by a newer tuimon: refuse it rather
than write rows it would misread.

Search indexes are SQLite FTS5 tables kept in step by triggers (``enable_fts`` with
``create_triggers=True``, porter stemming): incident fields in ``incidents_fts``, every timeline
entry's text in ``entries_fts``. ``incident_labels`` is a derived index of kinds and tags (stored
as JSON lists on the incident) so that filtering by kind or tag does not scan every incident.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import sqlite_utils
from sqlite_utils.migrations import Migrations

from tuimon.errors import UserError
from tuimon.kb import db as kbdb

MIGRATION_SET = "tuimon_kb"
migrations = Migrations(MIGRATION_SET)
#: Names of the migrations this tuimon knows, oldest first.
MIGRATION_NAMES: list[str] = []


def _migration(fn: Callable[[sqlite_utils.Database], None]) -> Callable[[sqlite_utils.Database], None]:
    """Register ``fn`` as the next migration (its name is its identity in every database)."""
    MIGRATION_NAMES.append(fn.__name__)
    return migrations()(fn)


#: Columns indexed for full-text search, per table. ``kinds`` and ``tags`` are JSON lists; the
#: tokenizer splits them into words, which is what a search wants.
FTS_COLUMNS = {
    "incidents": ("title", "summary", "trigger", "detection", "root_cause", "resolution", "kinds", "tags"),
    "entries": ("text",),
}
FTS_TOKENIZE = "porter"
#: bm25 column weights of ``incidents_fts`` (same order as FTS_COLUMNS["incidents"]): a word in a
#: title or a tag says more about an incident than the same word in a long summary.
INCIDENT_WEIGHTS = (10.0, 3.0, 2.0, 2.0, 5.0, 5.0, 6.0, 6.0)

_LABEL_TRIGGERS = """
CREATE TRIGGER incident_labels_ai AFTER INSERT ON incidents BEGIN
  INSERT OR IGNORE INTO incident_labels (label, value, incident)
    SELECT 'kind', value, new.number FROM json_each(new.kinds)
    UNION SELECT 'tag', value, new.number FROM json_each(new.tags);
END;
CREATE TRIGGER incident_labels_au AFTER UPDATE OF kinds, tags ON incidents BEGIN
  DELETE FROM incident_labels WHERE incident = old.number;
  INSERT OR IGNORE INTO incident_labels (label, value, incident)
    SELECT 'kind', value, new.number FROM json_each(new.kinds)
    UNION SELECT 'tag', value, new.number FROM json_each(new.tags);
END;
"""


@_migration
def m001_initial(db: sqlite_utils.Database) -> None:
    db.executescript(
        """
        CREATE TABLE incidents (
            number INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            title TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('open', 'investigating', 'mitigated', 'resolved')),
            severity TEXT NOT NULL CHECK (severity IN ('info', 'warning', 'critical')),
            run TEXT,
            host TEXT,
            ranks TEXT NOT NULL DEFAULT '[]',
            step_first INTEGER,
            step_last INTEGER,
            kinds TEXT NOT NULL DEFAULT '[]',
            tags TEXT NOT NULL DEFAULT '[]',
            summary TEXT NOT NULL DEFAULT '',
            "trigger" TEXT NOT NULL DEFAULT '',
            detection TEXT NOT NULL DEFAULT '',
            root_cause TEXT NOT NULL DEFAULT '',
            resolution TEXT NOT NULL DEFAULT '',
            created_at TEXT NOT NULL,
            created_by TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            updated_by TEXT NOT NULL,
            resolved_at TEXT,
            resolved_by TEXT
        );
        CREATE INDEX incidents_by_update ON incidents (updated_at);
        CREATE INDEX incidents_by_status ON incidents (status, updated_at);
        CREATE INDEX incidents_by_run ON incidents (run);
        CREATE INDEX incidents_by_creation ON incidents (created_at);

        CREATE TABLE entries (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            incident INTEGER NOT NULL REFERENCES incidents (number),
            time TEXT NOT NULL,
            author TEXT NOT NULL,
            type TEXT NOT NULL
                CHECK (type IN ('note', 'tried', 'result', 'status_change', 'event', 'runbook_step')),
            text TEXT NOT NULL DEFAULT '',
            outcome TEXT CHECK (outcome IN ('helped', 'unknown', 'no_effect', 'made_worse')),
            step INTEGER,
            data TEXT
        );
        CREATE INDEX entries_by_incident ON entries (incident, type);

        CREATE TABLE context (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            incident INTEGER NOT NULL REFERENCES incidents (number),
            kind TEXT NOT NULL,
            captured_at TEXT NOT NULL,
            author TEXT NOT NULL,
            data TEXT NOT NULL
        );
        CREATE INDEX context_by_incident ON context (incident);

        CREATE TABLE incident_labels (
            label TEXT NOT NULL,
            value TEXT NOT NULL,
            incident INTEGER NOT NULL,
            PRIMARY KEY (label, value, incident)
        ) WITHOUT ROWID;
        CREATE INDEX incident_labels_by_incident ON incident_labels (incident);
        """
    )
    db.executescript(_LABEL_TRIGGERS)
    build_search_index(db)


def build_search_index(db: sqlite_utils.Database) -> None:
    """(Re)create the FTS5 tables from the content tables, with their sync triggers."""
    for table, columns in FTS_COLUMNS.items():
        db[table].enable_fts(columns, create_triggers=True, tokenize=FTS_TOKENIZE, replace=True)
    weights = ", ".join(str(weight) for weight in INCIDENT_WEIGHTS)
    # A persistent rank function, so that "ORDER BY rank" uses the weights (and FTS5 can sort).
    db.execute("INSERT INTO incidents_fts (incidents_fts, rank) VALUES ('rank', ?)", [f"bm25({weights})"])


def drop_search_index(db: sqlite_utils.Database) -> None:
    for table in FTS_COLUMNS:
        db[table].disable_fts()


@contextlib.contextmanager
def indexes_suspended(db: sqlite_utils.Database) -> Iterator[None]:
    """Bulk loading: drop the FTS and label triggers, then rebuild both indexes in one pass.

    Per-row trigger maintenance makes loading a million rows many times slower than indexing them
    once at the end. Run inside one write transaction; nobody else should be writing meanwhile.
    """
    drop_search_index(db)
    db.execute("DROP TRIGGER IF EXISTS incident_labels_ai")
    db.execute("DROP TRIGGER IF EXISTS incident_labels_au")
    yield
    db.execute("DELETE FROM incident_labels")
    db.execute(
        """INSERT OR IGNORE INTO incident_labels (label, value, incident)
           SELECT 'kind', j.value, i.number FROM incidents i, json_each(i.kinds) j
           UNION SELECT 'tag', j.value, i.number FROM incidents i, json_each(i.tags) j"""
    )
    db.executescript(_LABEL_TRIGGERS)
    build_search_index(db)


def schema_version(db: sqlite_utils.Database) -> int:
    """How many of our migrations this database has (the number tuimon reports as its version)."""
    return len(migrations.applied(db))


def latest_version() -> int:
    return len(MIGRATION_NAMES)


def ensure_current(db: sqlite_utils.Database) -> None:
    """Apply pending migrations under the write lock; refuse a database from a newer tuimon.

    Many processes may open a new knowledge base at the same moment: the first one to get the
    lock migrates, the others find nothing pending once they get it.
    """
    known = set(MIGRATION_NAMES)
    applied = {migration.name for migration in migrations.applied(db)}
    unknown = sorted(applied - known)
    if unknown:
        raise UserError(
            f"this knowledge base was written by a newer tuimon (schema has {', '.join(unknown)}); "
            "upgrade tuimon to use it"
        )
    if not migrations.pending(db):
        return
    kbdb.write(db, lambda: migrations.apply(db))
