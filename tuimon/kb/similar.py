""" "Seen before": past incidents of the same kind, and what the team tried on them, helpful first.

When a new event fires, the most useful thing the knowledge base can say is how often this
happened and what worked: "seen before: 3 incidents, 2 resolved; helped: lowered the learning
rate (2x)". Tried entries are grouped by their text (case and spacing ignored), so the same fix
written twice counts twice.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import sqlite_utils

from tuimon.kb import incidents
from tuimon.kb.model import OUTCOMES, Incident

#: Past incidents whose tried entries are aggregated (the most recent ones).
RECENT_INCIDENTS = 200
_TRAILING = re.compile(r"[\s.;,!]+$")


@dataclass(frozen=True)
class Remedy:
    """Something tried on past incidents, with how often and where."""

    text: str
    outcome: str
    times: int
    incidents: tuple[int, ...]


@dataclass(frozen=True)
class SeenBefore:
    kinds: tuple[str, ...]
    total: int
    resolved: int
    #: Up to ``limit`` past incidents: resolved first, then the most recently active.
    incidents: tuple[Incident, ...]
    #: What was tried, helpful first, then by how often.
    remedies: tuple[Remedy, ...]

    def headline(self) -> str:
        """One line for a notification, e.g. ``seen before: 3 incidents, 2 resolved; helped: ...``."""
        if not self.total:
            return "not seen before"
        noun = "incident" if self.total == 1 else "incidents"
        line = f"seen before: {self.total} {noun}, {self.resolved} resolved"
        helped = [remedy for remedy in self.remedies if remedy.outcome == "helped"]
        if helped:
            line += "; helped: " + ", ".join(
                f"{r.text} ({r.times}x)" if r.times > 1 else r.text for r in helped[:2]
            )
        return line


def _first_line(text: str) -> str:
    return _TRAILING.sub("", text.strip().split("\n", 1)[0])


def seen_before(
    db: sqlite_utils.Database, kinds: Iterable[str], *, exclude: int | None = None, limit: int = 5
) -> SeenBefore:
    """Past incidents sharing a kind with ``kinds`` (``exclude``: the incident being looked at)."""
    wanted = tuple(dict.fromkeys(kinds))
    if not wanted:
        return SeenBefore((), 0, 0, (), ())
    marks = ", ".join("?" * len(wanted))
    matching = f"SELECT DISTINCT incident FROM incident_labels WHERE label = 'kind' AND value IN ({marks})"
    params: list[object] = list(wanted)
    skip = ""
    if exclude is not None:
        skip = " AND number != ?"
        params.append(exclude)
    total, resolved = db.execute(
        "SELECT count(*), coalesce(sum(status = 'resolved'), 0) FROM incidents "
        f"WHERE number IN ({matching}){skip}",
        params,
    ).fetchone()
    recent = [
        row[0]
        for row in db.execute(
            f"SELECT number FROM incidents WHERE number IN ({matching}){skip} "
            "ORDER BY status = 'resolved' DESC, updated_at DESC LIMIT ?",
            [*params, RECENT_INCIDENTS],
        )
    ]
    shown = incidents.get_many(db, recent[:limit])
    grouped: dict[tuple[str, str], tuple[str, list[int]]] = {}
    if recent:
        rows = db.execute(
            f"SELECT incident, text, outcome FROM entries WHERE type = 'tried' AND incident IN "
            f"({', '.join('?' * len(recent))}) ORDER BY time",
            recent,
        )
        for number, text, outcome in rows:
            label = _first_line(text)
            key = (" ".join(label.casefold().split()), outcome)
            grouped.setdefault(key, (label, []))[1].append(number)
    remedies = sorted(
        (
            Remedy(text, outcome, len(where), tuple(dict.fromkeys(where)))
            for (_, outcome), (text, where) in grouped.items()
        ),
        key=lambda r: (OUTCOMES.index(r.outcome), -r.times, r.text),
    )
    return SeenBefore(
        kinds=wanted,
        total=int(total),
        resolved=int(resolved),
        incidents=tuple(shown[n] for n in recent[:limit]),
        remedies=tuple(remedies),
    )
