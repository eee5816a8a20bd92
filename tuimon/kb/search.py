"""Full-text search over incidents and their timelines (SQLite FTS5, bm25, highlighted snippets).

What people type is turned into a safe FTS5 query: every word is quoted (sqlite-utils
``quote_fts``), so ``grad-norm``, ``loss_spike`` or ``it's`` search for what they say instead of
being FTS syntax errors; ``"quoted phrases"`` stay phrases; ``word*`` is a prefix search and a bare
``OR`` / ``NOT`` / ``AND`` keep their meaning.

An incident is found through its own fields or through any timeline entry; its score adds its best
matches with decreasing weight, so one strong match (a title) and several good ones (notes) both
rank well. Snippets are computed only for the results shown.
"""

from __future__ import annotations

import re
import sqlite3
from collections import defaultdict
from dataclasses import dataclass

import sqlite_utils

from tuimon.errors import UserError
from tuimon.kb import incidents
from tuimon.kb.incidents import NO_FILTER, IncidentFilter
from tuimon.kb.model import Incident
from tuimon.kb.schema import FTS_COLUMNS

#: Markers put around highlighted words by FTS5 (private-use characters: never in real text).
HIGHLIGHT_OPEN = "\ue000"
HIGHLIGHT_CLOSE = "\ue001"
#: Words of context in a snippet.
SNIPPET_TOKENS = 14
#: Matching documents fetched per result wanted, before grouping them by incident.
HITS_PER_RESULT = 8
#: Weights of an incident's best, second and third matching documents in its score.
MATCH_WEIGHTS = (1.0, 0.5, 0.25)

_OPERATORS = {'"OR"': "OR", '"AND"': "AND", '"NOT"': "NOT"}
_PREFIX = re.compile(r'^"(.+)\*"$')


@dataclass(frozen=True)
class Snippet:
    """Text around the match as (text, highlighted) segments: a UI styles them, a CLI marks them."""

    segments: tuple[tuple[str, bool], ...]

    def marked(self, open_mark: str = "[", close_mark: str = "]") -> str:
        return "".join(f"{open_mark}{text}{close_mark}" if hit else text for text, hit in self.segments)


@dataclass(frozen=True)
class SearchHit:
    incident: Incident
    #: Higher is better (negated bm25, combined over the incident's best matches).
    score: float
    #: Where the best match is: an incident field ("title", "root_cause" ...) or an entry type.
    matched: str
    snippet: Snippet
    #: The timeline entry that matched best, if it was an entry (and a "tried" entry's outcome).
    entry_id: str | None = None
    outcome: str | None = None


def fts_query(db: sqlite_utils.Database, text: str) -> str:
    """The FTS5 query for what a user typed (see the module docstring)."""
    parts = []
    for part in db.quote_fts(text).split(" "):
        if part in _OPERATORS:
            parts.append(_OPERATORS[part])
        elif prefix := _PREFIX.match(part):
            parts.append(f'"{prefix.group(1)}"*')
        else:
            parts.append(part)
    query = " ".join(parts)
    if not query.strip('" *'):
        raise UserError("search for at least one word")
    return query


def _split(marked: str) -> Snippet:
    segments = []
    for piece in re.split(f"({HIGHLIGHT_OPEN}.*?{HIGHLIGHT_CLOSE})", " ".join(marked.split())):
        if piece.startswith(HIGHLIGHT_OPEN):
            segments.append((piece[1:-1], True))
        elif piece:
            segments.append((piece, False))
    return Snippet(tuple(segments))


@dataclass
class _Hit:
    score: float
    number: int
    seq: int | None = None
    entry_type: str | None = None
    outcome: str | None = None
    entry_id: str | None = None


def search(
    db: sqlite_utils.Database, text: str, *, where: IncidentFilter = NO_FILTER, limit: int = 20
) -> list[SearchHit]:
    """Incidents matching ``text``, best first, each with a highlighted snippet of its best match."""
    query = fts_query(db, text)
    fetch = max(limit, 1) * HITS_PER_RESULT
    try:
        hits = _incident_hits(db, query, where, fetch) + _entry_hits(db, query, where, fetch)
    except sqlite3.OperationalError as exc:
        if "fts5" in str(exc):
            raise UserError(
                f"cannot search for {text!r} ({exc}); put quotes around OR, AND or NOT to search for the word"
            ) from None
        raise
    by_incident: dict[int, list[_Hit]] = defaultdict(list)
    for hit in hits:
        by_incident[hit.number].append(hit)
    ranked = []
    for number, found in by_incident.items():
        found.sort(key=lambda hit: hit.score)
        score = -sum(weight * hit.score for weight, hit in zip(MATCH_WEIGHTS, found, strict=False))
        ranked.append((score, number, found[0]))
    ranked.sort(key=lambda item: (-item[0], -item[1]))
    ranked = ranked[:limit]
    shown = incidents.get_many(db, [number for _, number, _ in ranked])
    field_snippets = _incident_snippets(db, query, [n for _, n, best in ranked if best.seq is None])
    entry_snippets = _entry_snippets(db, query, [best.seq for _, _, best in ranked if best.seq is not None])
    results = []
    for score, number, best in ranked:
        if best.seq is None:
            matched, snippet = field_snippets.get(number, ("title", Snippet(())))
        else:
            matched, snippet = best.entry_type or "note", entry_snippets.get(best.seq, Snippet(()))
        results.append(SearchHit(shown[number], score, matched, snippet, best.entry_id, best.outcome))
    return results


def _incident_hits(db: sqlite_utils.Database, query: str, where: IncidentFilter, fetch: int) -> list[_Hit]:
    if where.active:
        clause, params = where.sql("i")
        sql = (
            "SELECT f.rowid, f.rank FROM incidents_fts f JOIN incidents i ON i.number = f.rowid "
            f"WHERE incidents_fts MATCH ? AND {clause} ORDER BY f.rank LIMIT ?"
        )
        args = [query, *params, fetch]
    else:
        sql = "SELECT rowid, rank FROM incidents_fts WHERE incidents_fts MATCH ? ORDER BY rank LIMIT ?"
        args = [query, fetch]
    return [_Hit(score, number) for number, score in db.execute(sql, args)]


def _entry_hits(db: sqlite_utils.Database, query: str, where: IncidentFilter, fetch: int) -> list[_Hit]:
    if where.active:
        clause, params = where.sql("i")
        sql = (
            "SELECT e.incident, f.rank, e.seq, e.type, e.outcome, e.id FROM entries_fts f "
            "JOIN entries e ON e.seq = f.rowid JOIN incidents i ON i.number = e.incident "
            f"WHERE entries_fts MATCH ? AND {clause} ORDER BY f.rank LIMIT ?"
        )
        args = [query, *params, fetch]
    else:
        sql = (
            "SELECT e.incident, h.rank, e.seq, e.type, e.outcome, e.id FROM "
            "(SELECT rowid, rank FROM entries_fts WHERE entries_fts MATCH ? ORDER BY rank LIMIT ?) h "
            "JOIN entries e ON e.seq = h.rowid"
        )
        args = [query, fetch]
    return [
        _Hit(score, number, seq, kind, outcome, entry_id)
        for number, score, seq, kind, outcome, entry_id in db.execute(sql, args)
    ]


def _incident_snippets(
    db: sqlite_utils.Database, query: str, numbers: list[int]
) -> dict[int, tuple[str, Snippet]]:
    """Per incident, the first field (in index order) holding a match, and its snippet."""
    if not numbers:
        return {}
    columns = FTS_COLUMNS["incidents"]
    snippets = ", ".join(
        f"snippet(incidents_fts, {i}, '{HIGHLIGHT_OPEN}', '{HIGHLIGHT_CLOSE}', '…', {SNIPPET_TOKENS})"
        for i in range(len(columns))
    )
    sql = (
        f"SELECT rowid, {snippets} FROM incidents_fts WHERE incidents_fts MATCH ? "
        f"AND rowid IN ({', '.join('?' * len(numbers))})"
    )
    found: dict[int, tuple[str, Snippet]] = {}
    for row in db.execute(sql, [query, *numbers]):
        for column, marked in zip(columns, row[1:], strict=True):
            if marked and HIGHLIGHT_OPEN in marked:
                found[row[0]] = (column, _split(marked))
                break
    return found


def _entry_snippets(db: sqlite_utils.Database, query: str, seqs: list[int]) -> dict[int, Snippet]:
    if not seqs:
        return {}
    marks = ", ".join("?" * len(seqs))
    sql = (
        f"SELECT rowid, snippet(entries_fts, 0, '{HIGHLIGHT_OPEN}', '{HIGHLIGHT_CLOSE}', '…', "
        f"{SNIPPET_TOKENS}) FROM entries_fts WHERE entries_fts MATCH ? AND rowid IN ({marks})"
    )
    return {seq: _split(marked) for seq, marked in db.execute(sql, [query, *seqs])}
