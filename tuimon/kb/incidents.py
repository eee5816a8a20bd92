"""Incident operations on the database: open, find, list, append to the timeline, change, merge.

Every write is one ``BEGIN IMMEDIATE`` transaction (:func:`tuimon.kb.db.write`) that re-reads what
it changes, so two engineers acting on the same incident at once both keep their work: entries are
appended, never rewritten, and field changes apply to the latest row, not to a stale copy.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlite_utils

from publisher.wire.protocol import update_words
from tuimon.errors import UserError
from tuimon.kb import db as kbdb
from tuimon.kb import model
from tuimon.kb.model import ContextRecord, Entry, Incident, IncidentDraft

_INCIDENT_COLUMNS = tuple(Incident.__dataclass_fields__)
_JSON_LIST_COLUMNS = ("ranks", "kinds", "tags")


def _q(name: str) -> str:
    """A quoted identifier (``trigger`` is an SQL keyword)."""
    return f'"{name}"'


_SELECT_INCIDENT = f"SELECT {', '.join(_q(c) for c in _INCIDENT_COLUMNS)} FROM incidents"


@dataclass(frozen=True)
class IncidentFilter:
    """What a list or a search is narrowed to. Values within a field are OR-ed, fields AND-ed."""

    statuses: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    run: str | None = None
    since: str | None = None
    until: str | None = None

    def sql(self, alias: str = "incidents") -> tuple[str, list[Any]]:
        """A WHERE fragment (``1`` when empty) and its parameters, for incidents named ``alias``."""
        clauses: list[str] = []
        params: list[Any] = []
        if self.statuses:
            clauses.append(f"{alias}.status IN ({', '.join('?' * len(self.statuses))})")
            params.extend(self.statuses)
        for label, values in (("kind", self.kinds), ("tag", self.tags)):
            if values:
                clauses.append(
                    f"{alias}.number IN (SELECT incident FROM incident_labels WHERE label = ? "
                    f"AND value IN ({', '.join('?' * len(values))}))"
                )
                params.extend([label, *values])
        if self.run:
            clauses.append(f"{alias}.run = ?")
            params.append(self.run)
        if self.since:
            clauses.append(f"{alias}.created_at >= ?")
            params.append(self.since)
        if self.until:
            clauses.append(f"{alias}.created_at < ?")
            params.append(self.until)
        return (" AND ".join(clauses) or "1"), params

    @property
    def active(self) -> bool:
        return any((self.statuses, self.kinds, self.tags, self.run, self.since, self.until))


#: The filter that keeps everything.
NO_FILTER = IncidentFilter()


@dataclass(frozen=True)
class MergeOutcome:
    """What importing one incident changed."""

    number: int
    created: bool
    fields_updated: bool
    entries_added: int
    context_added: int


# -- reading -------------------------------------------------------------------------------


def incident_from_row(row: Mapping[str, Any]) -> Incident:
    values = dict(row)
    for name in _JSON_LIST_COLUMNS:
        values[name] = tuple(json.loads(values[name]))
    return Incident(**{name: values[name] for name in _INCIDENT_COLUMNS})


def entry_from_row(row: Mapping[str, Any]) -> Entry:
    return Entry(
        id=row["id"],
        incident=row["incident"],
        time=row["time"],
        author=row["author"],
        type=row["type"],
        text=row["text"],
        outcome=row["outcome"],
        step=row["step"],
        data=json.loads(row["data"]) if row["data"] is not None else None,
    )


class UnknownIncident(UserError):
    """No incident answers to what the user gave; the knowledge base adds where it looked."""


#: Characters a UUID prefix needs to name an incident.
_MIN_PREFIX = 4


def resolve(db: sqlite_utils.Database, ref: str | int) -> int:
    """The number of the incident ``ref`` names: ``12``, ``#12``, a UUID or a unique UUID prefix.

    A bare run of digits is a number first; when no incident has that number and it is long
    enough for a prefix, it is tried as a UUID prefix (UUIDs are hex: one in 40 eight-character
    prefixes is all digits).
    """
    number = ref if isinstance(ref, int) else model.number_ref(str(ref))
    if number is not None and not 0 < number <= model.MAX_INT:
        raise UnknownIncident(f"no incident #{str(number)[:24]}")
    if number is not None:
        if db.execute("SELECT 1 FROM incidents WHERE number = ?", [number]).fetchone() is not None:
            return number
        text = str(ref).strip()
        if isinstance(ref, int) or text.startswith("#") or len(text) < _MIN_PREFIX:
            raise UnknownIncident(f"no incident #{number}")
    prefix = str(ref).strip().lower()
    if len(prefix) < _MIN_PREFIX:
        raise UserError(
            f"{ref!r} is neither an incident number nor a UUID prefix of {_MIN_PREFIX} or more characters"
        )
    rows = db.execute(
        "SELECT number, id FROM incidents WHERE id >= ? AND id < ? ORDER BY id LIMIT 6",
        [prefix, prefix + "\uffff"],
    ).fetchall()
    if not rows:
        if number is not None:
            raise UnknownIncident(f"no incident #{number}, nor one whose id starts {prefix!r}")
        raise UnknownIncident(f"no incident with an id starting {prefix!r}")
    if len(rows) > 1:
        shown = ", ".join(f"#{n} {uid}" for n, uid in rows[:5])
        raise UserError(f"{prefix!r} matches several incidents ({shown}); give more of the UUID")
    return int(rows[0][0])


def get(db: sqlite_utils.Database, number: int) -> Incident:
    rows = list(db.query(f"{_SELECT_INCIDENT} WHERE number = ?", [number]))
    if not rows:
        raise UserError(f"no incident #{number} in this knowledge base")
    return incident_from_row(rows[0])


def get_many(db: sqlite_utils.Database, numbers: Sequence[int]) -> dict[int, Incident]:
    """Incidents by number, fetched in one query (search and suggestions show many at once)."""
    if not numbers:
        return {}
    marks = ", ".join("?" * len(numbers))
    rows = db.query(f"{_SELECT_INCIDENT} WHERE number IN ({marks})", list(numbers))
    return {row["number"]: incident_from_row(row) for row in rows}


def list_incidents(
    db: sqlite_utils.Database, where: IncidentFilter = NO_FILTER, *, limit: int | None = 50, offset: int = 0
) -> list[Incident]:
    """Incidents matching ``where``, most recently active first."""
    clause, params = where.sql()
    sql = f"{_SELECT_INCIDENT} WHERE {clause} ORDER BY updated_at DESC, number DESC"
    if limit is not None:
        sql += " LIMIT ? OFFSET ?"
        params = [*params, limit, offset]
    return [incident_from_row(row) for row in db.query(sql, params)]


def count(db: sqlite_utils.Database, where: IncidentFilter = NO_FILTER) -> int:
    clause, params = where.sql()
    return int(db.execute(f"SELECT count(*) FROM incidents WHERE {clause}", params).fetchone()[0])


def all_numbers(db: sqlite_utils.Database) -> list[int]:
    return [row[0] for row in db.execute("SELECT number FROM incidents ORDER BY number")]


def timeline(db: sqlite_utils.Database, number: int) -> list[Entry]:
    """Entries in time order (insertion order among equal times)."""
    rows = db.query("SELECT * FROM entries WHERE incident = ? ORDER BY time, seq", [number])
    return [entry_from_row(row) for row in rows]


def context(db: sqlite_utils.Database, number: int) -> list[ContextRecord]:
    rows = db.query("SELECT * FROM context WHERE incident = ? ORDER BY captured_at, seq", [number])
    return [
        ContextRecord(
            id=row["id"],
            incident=row["incident"],
            kind=row["kind"],
            captured_at=row["captured_at"],
            author=row["author"],
            data=json.loads(row["data"]),
        )
        for row in rows
    ]


# -- writing -------------------------------------------------------------------------------


def create(db: sqlite_utils.Database, draft: IncidentDraft, author: str) -> Incident:
    """Open an incident from ``draft``: the row, its triggering events and its captured context."""
    first, last = model.step_range(draft.step_first, draft.step_last)
    row: dict[str, Any] = {
        "title": model.title_text(draft.title),
        "status": model.choice(draft.status, model.STATUSES, "status"),
        "severity": model.choice(draft.severity, model.SEVERITY_CHOICES, "severity"),
        "run": model.optional_line(draft.run),
        "host": model.optional_line(draft.host),
        "ranks": model.dumps(list(model.ranks(draft.ranks))),
        "step_first": first,
        "step_last": last,
        "kinds": model.dumps(list(model.labels(draft.kinds, "kind"))),
        "tags": model.dumps(list(model.labels(draft.tags, "tag"))),
        **{name: model.body_text(getattr(draft, name)) for name in model.TEXT_FIELDS},
    }
    for kind in draft.context:
        model.choice(kind, model.CONTEXT_KINDS, "context kind")

    def body() -> int:
        stamp = model.now()
        full = {
            **row,
            "id": model.new_id(),
            "created_at": stamp,
            "created_by": author,
            "updated_at": stamp,
            "updated_by": author,
            "resolved_at": stamp if row["status"] == "resolved" else None,
            "resolved_by": author if row["status"] == "resolved" else None,
        }
        number = _insert_incident(db, full)
        for event in draft.events:
            _insert_entry(db, _event_entry(number, event, author, stamp))
        for kind, data in draft.context.items():
            _insert_context(db, ContextRecord(model.new_id(), number, kind, stamp, author, data))
        return number

    return get(db, kbdb.write(db, body))


def add_entry(
    db: sqlite_utils.Database,
    number: int,
    entry_type: str,
    text: str,
    author: str,
    *,
    outcome: str | None = None,
    step: int | None = None,
    data: Mapping[str, Any] | None = None,
) -> Entry:
    """Append one entry. A "tried" entry needs an outcome; nothing else may have one."""
    entry_type = model.choice(entry_type, model.ENTRY_TYPES, "entry type")
    if entry_type == "tried":
        outcome = model.choice(outcome or "unknown", model.OUTCOMES, "outcome")
    elif outcome is not None or step is not None:
        raise UserError("only a 'tried' entry has an outcome and a step")
    if step is not None:
        step = model.whole_number(step, "the step")
    text = model.body_text(text)
    if not text and entry_type in ("note", "tried", "result"):
        raise UserError(f"a {entry_type} entry needs some text")

    def body() -> Entry:
        _require(db, number)
        entry = Entry(model.new_id(), number, model.now(), author, entry_type, text, outcome, step, data)
        _insert_entry(db, entry)
        _touch(db, number, author, entry.time)
        return entry

    return kbdb.write(db, body)


def set_status(
    db: sqlite_utils.Database, number: int, status: str, author: str, *, note: str = ""
) -> Entry | None:
    """Change the status (a "status_change" entry records from/to); None when it already was."""
    status = model.choice(status, model.STATUSES, "status")
    note = model.body_text(note)

    def body() -> Entry | None:
        old = _require(db, number)["status"]
        if old == status:
            return None
        stamp = model.now()
        resolved = status == "resolved"
        db.execute(
            "UPDATE incidents SET status = ?, updated_at = ?, updated_by = ?, resolved_at = ?, "
            "resolved_by = ? WHERE number = ?",
            [status, stamp, author, stamp if resolved else None, author if resolved else None, number],
        )
        entry = Entry(
            model.new_id(), number, stamp, author, "status_change", note, data={"from": old, "to": status}
        )
        _insert_entry(db, entry)
        return entry

    return kbdb.write(db, body)


def update(
    db: sqlite_utils.Database,
    number: int,
    author: str,
    *,
    fields: Mapping[str, Any] | None = None,
    add_tags: Iterable[str] = (),
    remove_tags: Iterable[str] = (),
    add_kinds: Iterable[str] = (),
) -> Incident:
    """Change fields (see :data:`model.EDITABLE_FIELDS`) and tags on the latest version of the row."""
    changes: dict[str, Any] = {}
    for name, value in (fields or {}).items():
        if name not in model.EDITABLE_FIELDS:
            raise UserError(f"field {name!r} cannot be edited (editable: {', '.join(model.EDITABLE_FIELDS)})")
        if name == "title":
            changes[name] = model.title_text(value)
        elif name == "severity":
            changes[name] = model.choice(value, model.SEVERITY_CHOICES, "severity")
        elif name in ("run", "host"):
            changes[name] = model.optional_line(value)
        else:
            changes[name] = model.body_text(value)
    adding = model.labels(add_tags, "tag")
    removing = set(model.labels(remove_tags, "tag"))
    adding_kinds = model.labels(add_kinds, "kind")

    def body() -> None:
        current = _require(db, number)
        values = dict(changes)
        if adding or removing:
            tags = [t for t in json.loads(current["tags"]) if t not in removing]
            values["tags"] = model.dumps(list(model.labels([*tags, *adding], "tag")))
        if adding_kinds:
            values["kinds"] = model.dumps(
                list(model.labels([*json.loads(current["kinds"]), *adding_kinds], "kind"))
            )
        if not values:
            return
        _update_row(db, number, {**values, "updated_at": model.now(), "updated_by": author})

    kbdb.write(db, body)
    return get(db, number)


def attach(
    db: sqlite_utils.Database,
    number: int,
    events: Sequence[Mapping[str, Any]],
    captured: Mapping[str, Mapping[str, Any]],
    author: str,
) -> list[Entry]:
    """Add more events (and the context captured with them) to an open incident.

    An event already attached (same run and event id) is not added twice; the incident's kinds,
    ranks and step range grow to cover the new events.
    """
    for kind in captured:
        model.choice(kind, model.CONTEXT_KINDS, "context kind")

    def body() -> list[Entry]:
        current = _require(db, number)
        known = {
            (run, event_id)
            for run, event_id in db.execute(
                "SELECT json_extract(data, '$.run'), json_extract(data, '$.id') FROM entries "
                "WHERE incident = ? AND type = 'event'",
                [number],
            )
        }
        stamp = model.now()
        added = []
        for event in events:
            if (event.get("run"), event.get("id")) in known:
                continue
            known.add((event.get("run"), event.get("id")))
            entry = _event_entry(number, event, author, stamp)
            _insert_entry(db, entry)
            added.append(entry)
        for kind, data in captured.items():
            _insert_context(db, ContextRecord(model.new_id(), number, kind, stamp, author, data))
        steps = [e["step"] for e in events if isinstance(e.get("step"), int)]
        steps += [step for step in (current["step_first"], current["step_last"]) if step is not None]
        kinds = model.labels(
            [*json.loads(current["kinds"]), *(str(e["kind"]) for e in events if e.get("kind"))], "kind"
        )
        ranks = model.ranks(
            [*json.loads(current["ranks"]), *(e["rank"] for e in events if isinstance(e.get("rank"), int))]
        )
        values = {
            "kinds": model.dumps(list(kinds)),
            "ranks": model.dumps(list(ranks)),
            "step_first": min(steps, default=None),
            "step_last": max(steps, default=None),
            "run": current["run"] or next((e["run"] for e in events if e.get("run")), None),
            "host": current["host"] or next((e["host"] for e in events if e.get("host")), None),
        }
        _update_row(db, number, {**values, "updated_at": stamp, "updated_by": author})
        return added

    return kbdb.write(db, body)


def merge(
    db: sqlite_utils.Database, incident: Incident, entries: Sequence[Entry], records: Sequence[ContextRecord]
) -> MergeOutcome:
    """Bring an incident read from an export into this knowledge base, matched by UUID.

    New incidents keep their number when it is free here. For a known incident the fields of the
    more recently updated side win; timeline entries and context are unions by id, so importing
    the same file twice, or files from two hosts, never duplicates anything.
    """

    def body() -> MergeOutcome:
        found = db.execute("SELECT number, updated_at FROM incidents WHERE id = ?", [incident.id]).fetchone()
        row = incident.to_json()
        for name in _JSON_LIST_COLUMNS:
            row[name] = model.dumps(row[name])
        created = found is None
        fields_updated = False
        if created:
            taken = db.execute("SELECT 1 FROM incidents WHERE number = ?", [incident.number]).fetchone()
            if taken:
                del row["number"]
            number = _insert_incident(db, row)
        else:
            number, updated_at = found
            if incident.updated_at > updated_at:
                del row["number"], row["id"]
                _update_row(db, number, row)
                fields_updated = True
        added_entries = sum(_insert_entry(db, entry, number=number) for entry in entries)
        added_context = sum(_insert_context(db, record, number=number) for record in records)
        return MergeOutcome(number, created, fields_updated, added_entries, added_context)

    return kbdb.write(db, body)


# -- helpers (run inside a write transaction) ----------------------------------------------


def _require(db: sqlite_utils.Database, number: int) -> dict[str, Any]:
    rows = list(db.query("SELECT * FROM incidents WHERE number = ?", [number]))
    if not rows:
        raise UserError(f"no incident #{number} in this knowledge base")
    return rows[0]


def _insert_incident(db: sqlite_utils.Database, row: Mapping[str, Any]) -> int:
    columns = list(row)
    names = ", ".join(_q(c) for c in columns)
    cursor = db.execute(
        f"INSERT INTO incidents ({names}) VALUES ({', '.join('?' * len(columns))})",
        [row[c] for c in columns],
    )
    number = cursor.lastrowid
    assert number is not None, "a successful INSERT sets lastrowid"
    return number


def _update_row(db: sqlite_utils.Database, number: int, values: Mapping[str, Any]) -> None:
    assignments = ", ".join(f"{_q(name)} = ?" for name in values)
    db.execute(f"UPDATE incidents SET {assignments} WHERE number = ?", [*values.values(), number])


def _touch(db: sqlite_utils.Database, number: int, author: str, stamp: str) -> None:
    db.execute(
        "UPDATE incidents SET updated_at = ?, updated_by = ? WHERE number = ?", [stamp, author, number]
    )


def _insert_entry(db: sqlite_utils.Database, entry: Entry, *, number: int | None = None) -> int:
    """Insert unless an entry with this id exists; returns how many rows were added (0 or 1)."""
    cursor = db.execute(
        "INSERT INTO entries (id, incident, time, author, type, text, outcome, step, data) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
        [
            entry.id,
            entry.incident if number is None else number,
            entry.time,
            entry.author,
            entry.type,
            entry.text,
            entry.outcome,
            entry.step,
            None if entry.data is None else model.dumps(entry.data),
        ],
    )
    return cursor.rowcount


def _insert_context(db: sqlite_utils.Database, record: ContextRecord, *, number: int | None = None) -> int:
    """Insert unless a record with this id exists; returns how many rows were added (0 or 1)."""
    cursor = db.execute(
        "INSERT INTO context (id, incident, kind, captured_at, author, data) VALUES (?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (id) DO NOTHING",
        [
            record.id,
            record.incident if number is None else number,
            record.kind,
            record.captured_at,
            record.author,
            model.dumps(record.data),
        ],
    )
    return cursor.rowcount


def _event_entry(number: int, event: Mapping[str, Any], author: str, stamp: str) -> Entry:
    """An "event" entry: the event's own time (when it fired), its message (and its latest repeat),
    the whole event as data."""
    ts = event.get("ts")
    when = model.format_time(datetime.fromtimestamp(ts, UTC)) if isinstance(ts, int | float) else stamp
    count = event.get("count")
    update = update_words(count if isinstance(count, int) else 1, event.get("latest"))
    body = str(event.get("message", "")) + (f"\n\n{update}" if update else "")
    return Entry(
        model.new_id(),
        number,
        when,
        author,
        "event",
        model.body_text(body),
        data=dict(event),
    )
