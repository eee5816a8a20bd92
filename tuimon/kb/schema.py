"""The database schema, as an ordered list of migrations (sqlite-utils ``Migrations``).

A knowledge base lives for years and is opened by whatever tuimon version each engineer has, so
the schema only moves forward by named migrations, applied once under the write lock. A database
that has migrations this tuimon does not know was written by a newer tuimon: refuse it rather
than write rows it would misread.

Search uses one FTS5 table, ``search_index`` (porter stemming), kept in step by triggers: one
document per non-empty incident field and one per timeline entry. One table rather than one per
content table (sqlite-utils ``enable_fts``) because bm25 scores are only comparable within one
index: with two, a word's rarity is counted twice differently and a passing mention in a note
could outrank the incident's title. ``incident_labels`` is a derived index of kinds and tags
(stored as JSON lists on the incident) so that filtering by kind or tag does not scan every
incident.
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


#: Incident fields indexed for search, in slot order (a field's document has rowid
#: ``INCIDENT_DOCS + number * 16 + slot``; entries' documents have the entry's ``seq``).
SEARCH_FIELDS = ("title", "summary", "trigger", "detection", "root_cause", "resolution", "kinds", "tags")
#: First rowid of incident-field documents, above any entry's seq.
INCIDENT_DOCS = 1 << 40
_SLOTS = 16
SEARCH_TOKENIZE = "porter"


def _field_body(alias: str, field: str) -> str:
    """SQL for a field's searchable text; kinds and tags (JSON lists) read as ``a, b``."""
    column = f'{alias}."{field}"'
    if field in ("kinds", "tags"):
        return f"""replace(replace(replace({column}, '["', ''), '","', ', '), '"]', '')"""
    return column


def _index_incident_sql(alias: str, where: str = "") -> list[str]:
    """Statements adding the field documents of incident ``alias`` (``new`` in a trigger)."""
    statements = []
    for slot, field in enumerate(SEARCH_FIELDS):
        body = _field_body(alias, field)
        source = f" FROM incidents AS {alias}" if alias != "new" else ""
        condition = f"{body} NOT IN ('', '[]')" + (f" AND {where}" if where else "")
        statements.append(
            f"INSERT INTO search_index (rowid, incident, source, body) SELECT "
            f"{INCIDENT_DOCS} + {alias}.number * {_SLOTS} + {slot}, {alias}.number, '{field}', {body}"
            f"{source} WHERE {condition};"
        )
    return statements


_SEARCH_TRIGGERS = f"""
CREATE TRIGGER search_entries_ai AFTER INSERT ON entries WHEN new.text != '' BEGIN
  INSERT INTO search_index (rowid, incident, source, body) VALUES (new.seq, new.incident, new.type, new.text);
END;
CREATE TRIGGER search_incidents_ai AFTER INSERT ON incidents BEGIN
  {" ".join(_index_incident_sql("new"))}
END;
CREATE TRIGGER search_incidents_au AFTER UPDATE OF {", ".join(f'"{f}"' for f in SEARCH_FIELDS)}
ON incidents BEGIN
  DELETE FROM search_index WHERE rowid BETWEEN {INCIDENT_DOCS} + old.number * {_SLOTS}
    AND {INCIDENT_DOCS} + old.number * {_SLOTS} + {_SLOTS - 1};
  {" ".join(_index_incident_sql("new"))}
END;
"""
_SEARCH_TRIGGER_NAMES = ("search_entries_ai", "search_incidents_ai", "search_incidents_au")

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
    db.execute(
        f"CREATE VIRTUAL TABLE search_index USING fts5 (incident UNINDEXED, source UNINDEXED, body, "
        f"tokenize = '{SEARCH_TOKENIZE}')"
    )
    db.executescript(_LABEL_TRIGGERS + _SEARCH_TRIGGERS)


def _fill_search_index(db: sqlite_utils.Database) -> None:
    """Index every incident field and entry (used after a bulk load, with the triggers off)."""
    db.execute("DELETE FROM search_index")
    for statement in _index_incident_sql("i"):
        db.execute(statement.rstrip(";"))
    db.execute(
        "INSERT INTO search_index (rowid, incident, source, body) "
        "SELECT seq, incident, type, text FROM entries WHERE text != ''"
    )
    db.execute("INSERT INTO search_index (search_index) VALUES ('optimize')")


@contextlib.contextmanager
def indexes_suspended(db: sqlite_utils.Database) -> Iterator[None]:
    """Bulk loading: drop the search and label triggers, then rebuild both indexes in one pass.

    Per-row trigger maintenance makes loading a million rows many times slower than indexing them
    once at the end. Run inside one write transaction; nobody else should be writing meanwhile.
    """
    for name in (*_SEARCH_TRIGGER_NAMES, "incident_labels_ai", "incident_labels_au"):
        db.execute(f"DROP TRIGGER IF EXISTS {name}")
    yield
    db.execute("DELETE FROM incident_labels")
    db.execute(
        """INSERT OR IGNORE INTO incident_labels (label, value, incident)
           SELECT 'kind', j.value, i.number FROM incidents i, json_each(i.kinds) j
           UNION SELECT 'tag', j.value, i.number FROM incidents i, json_each(i.tags) j"""
    )
    _fill_search_index(db)
    db.executescript(_LABEL_TRIGGERS + _SEARCH_TRIGGERS)


def schema_version(db: sqlite_utils.Database) -> int:
    """How many of our migrations this database has (the number tuimon reports as its version)."""
    return len(migrations.applied(db))


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
