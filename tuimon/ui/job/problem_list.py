"""The job's problems as a list: stragglers, hangs and lost ranks by rank and host, newest first.

Rebuilt only when the problems changed (a new update, or one going from current to over), from
:func:`tuimon.ui.job.problems.job_problems`; a few hundred rows at most (relays make one episode
per kind and rank, repeated in place).
"""

from __future__ import annotations

from collections import Counter

from textual.content import Content

from tuimon.ui.format import duration
from tuimon.ui.job.problems import PROBLEM_KINDS, PROBLEM_LOOK, Problem
from tuimon.ui.table import RowTable

#: Rows listed at most (the newest): a flood of lost ranks says the same thing many times.
MAX_ROWS = 200
_COLUMNS = (("what", 6), ("rank", 5), ("host", None), ("seen", 11), ("message", None))
_TITLES = {"rank_lost": "lost", "hang": "hung", "straggler": "slow"}


def _label(problem: Problem) -> Content:
    _, label, style = PROBLEM_LOOK[problem.kind]
    return Content.styled(label, style if problem.current else "$foreground 60%")


def _seen(problem: Problem, now: float) -> str:
    age = duration(now - problem.ts)
    return f"now ×{problem.count}" if problem.current else f"over, {age} ago"


class ProblemList(RowTable):
    DEFAULT_CSS = """
    ProblemList {
        border: round $primary 50%;
        border-title-color: $primary;
        border-title-style: bold;
        height: 1fr;
        overflow-x: hidden;
    }
    """
    # Read at a glance; the grid keeps the keys (its cursor, the drill-down).
    can_focus = False

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: tuple[object, ...] | None = None

    def on_mount(self) -> None:
        self.show_cursor = False  # not navigated: a highlighted first row would read as selected
        self.border_title = "Problems: none found by the relays"
        for key, width in _COLUMNS:
            self.add_column(key, key=key, width=width)

    def show(self, problems: list[Problem], now: float) -> None:
        rows = [
            (_label(p), "—" if p.rank is None else str(p.rank), p.host or "—", _seen(p, now), p.message)
            for p in problems[:MAX_ROWS]
        ]
        shown = tuple((p.id, p.current, p.count, cells[3]) for p, cells in zip(problems, rows, strict=False))
        if shown == self._shown:
            return
        self._shown = shown
        self.clear()
        for problem, cells in zip(problems, rows, strict=False):
            self.add_row(*cells, key=problem.id)
        current = Counter(p.kind for p in problems if p.current)
        if current:
            counts = ", ".join(f"{current[kind]} {_TITLES[kind]}" for kind in PROBLEM_KINDS if current[kind])
            self.border_title = f"Problems now: {counts}"
        else:
            self.border_title = "Problems: none now" if problems else "Problems: none found by the relays"
        if len(problems) > MAX_ROWS:
            self.border_subtitle = f"newest {MAX_ROWS} of {len(problems):,}"
        self.rows_changed()
