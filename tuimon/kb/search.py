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
from tuimon.kb.schema import INCIDENT_DOCS

#: Markers put around highlighted words by FTS5 (private-use characters: never in real text).
HIGHLIGHT_OPEN = "\ue000"
HIGHLIGHT_CLOSE = "\ue001"
#: Words of context in a snippet.
SNIPPET_TOKENS = 14
#: Matching documents fetched per result wanted, before grouping them by incident.
HITS_PER_RESULT = 8
#: Matching documents ranked at most (the newest ones; see :func:`_floor`).
RANK_CANDIDATES = 5_000
#: bm25 is multiplied by these: a word in the title says more about an incident than a note does.
SOURCE_BOOSTS = {
    "title": 3.0,
    "kinds": 2.0,
    "tags": 2.0,
    "root_cause": 2.0,
    "resolution": 2.0,
    "summary": 1.5,
    "trigger": 1.2,
    "detection": 1.2,
    "tried": 1.2,
    "result": 1.0,
    "note": 1.0,
    "event": 0.8,
    "status_change": 0.5,
}
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
    """One matching document: an incident field or a timeline entry (``seq`` set)."""

    score: float
    number: int
    source: str
    rowid: int

    @property
    def seq(self) -> int | None:
        return self.rowid if self.rowid < INCIDENT_DOCS else None


def search(
    db: sqlite_utils.Database, text: str, *, where: IncidentFilter = NO_FILTER, limit: int = 20
) -> list[SearchHit]:
    """Incidents matching ``text``, best first, each with a highlighted snippet of its best match."""
    query = fts_query(db, text)
    try:
        hits = _hits(db, query, where, max(limit, 1) * HITS_PER_RESULT)
    except sqlite3.OperationalError as exc:
        if "fts5" in str(exc):
            raise UserError(
                f"cannot search for {text!r} ({exc}); put quotes around OR, AND or NOT to search for the word"
            ) from None
        raise
    by_incident: dict[int, list[_Hit]] = defaultdict(list)
    for hit in hits:  # best first
        by_incident[hit.number].append(hit)
    ranked = sorted(
        (
            (
                -sum(weight * hit.score for weight, hit in zip(MATCH_WEIGHTS, found, strict=False)),
                number,
                found[0],
            )
            for number, found in by_incident.items()
        ),
        key=lambda item: (-item[0], -item[1]),
    )[:limit]
    shown = incidents.get_many(db, [number for _, number, _ in ranked])
    best = [hit for _, _, hit in ranked]
    snippets = _snippets(db, query, [hit.rowid for hit in best])
    entries = _entries(db, [hit.seq for hit in best if hit.seq is not None])
    results = []
    for score, number, hit in ranked:
        entry_id, outcome = entries.get(hit.seq, (None, None)) if hit.seq is not None else (None, None)
        results.append(
            SearchHit(
                shown[number], score, hit.source, snippets.get(hit.rowid, Snippet(())), entry_id, outcome
            )
        )
    return results


def _floor(db: sqlite_utils.Database, query: str) -> int | None:
    """The rowid below which matches are not ranked, or None when there are few enough to rank all.

    bm25 costs microseconds per matching document (it reads each one's length), so a word found in
    a hundred thousand notes would take most of a second to rank. Walking the matches in rowid
    order costs almost nothing, so for such words only the newest :data:`RANK_CANDIDATES` matches
    are ranked (incident fields first, then the newest entries): when a word is everywhere, recent
    incidents are the likelier answer.
    """
    row = db.execute(
        "SELECT rowid FROM search_index WHERE search_index MATCH ? ORDER BY rowid DESC LIMIT 1 OFFSET ?",
        [query, RANK_CANDIDATES - 1],
    ).fetchone()
    return None if row is None else int(row[0])


_BOOST_SQL = (
    "CASE source "
    + " ".join(f"WHEN '{name}' THEN {boost}" for name, boost in SOURCE_BOOSTS.items())
    + " ELSE 1.0 END"
)


def _hits(db: sqlite_utils.Database, query: str, where: IncidentFilter, fetch: int) -> list[_Hit]:
    """The best ``fetch`` matching documents, best first."""
    floor = _floor(db, query)
    clause, params = where.sql("i")
    narrowing = f" AND incident IN (SELECT i.number FROM incidents i WHERE {clause})" if where.active else ""
    while True:
        bound = "" if floor is None else " AND rowid >= ?"
        rows = db.execute(
            f"SELECT bm25(search_index) * {_BOOST_SQL} AS score, incident, source, rowid FROM search_index "
            f"WHERE search_index MATCH ?{bound}{narrowing} ORDER BY score LIMIT ?",
            [query, *([] if floor is None else [floor]), *(params if where.active else []), fetch],
        ).fetchall()
        if floor is None or len(rows) >= fetch or not where.active:
            return [_Hit(*row) for row in rows]
        floor = None  # a narrow filter left too few of the newest matches: rank them all


def _snippets(db: sqlite_utils.Database, query: str, rowids: list[int]) -> dict[int, Snippet]:
    if not rowids:
        return {}
    marks = ", ".join("?" * len(rowids))
    rows = db.execute(
        f"SELECT rowid, snippet(search_index, 2, '{HIGHLIGHT_OPEN}', '{HIGHLIGHT_CLOSE}', '…', "
        f"{SNIPPET_TOKENS}) FROM search_index WHERE search_index MATCH ? AND rowid IN ({marks})",
        [query, *rowids],
    )
    return {rowid: _split(marked) for rowid, marked in rows}


def _entries(db: sqlite_utils.Database, seqs: list[int]) -> dict[int, tuple[str, str | None]]:
    """Entry id and outcome of the entries shown, by seq."""
    if not seqs:
        return {}
    marks = ", ".join("?" * len(seqs))
    return {
        seq: (uid, outcome)
        for seq, uid, outcome in db.execute(
            f"SELECT seq, id, outcome FROM entries WHERE seq IN ({marks})", seqs
        )
    }
