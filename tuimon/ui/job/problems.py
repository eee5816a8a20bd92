"""What the relays found wrong with the job, read from the run's events, and which cells it marks.

The relay at the top of the tree sends ``straggler``, ``hang`` and ``rank_lost`` events about a
rank (docs/protocol.md, "Messages a relay makes about a rank"); an episode that lasts is re-sent
every :data:`publisher.wire.protocol.RELAY_REPEAT_S` with a higher count, and one that is over is simply
not re-sent. So a problem is *current* while its latest update is recent, and the grid marks only
current ones; the problem list keeps the others, marked as over.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from publisher.wire.protocol import RELAY_REPEAT_S
from tuimon.store import Cell, EventRecord

#: Kinds the relays send about ranks, the most serious first (a cell shows the first that applies).
PROBLEM_KINDS = ("rank_lost", "hang", "straggler")
#: kind -> (grid symbol, label with the symbol, style): symbol and word, never colour alone.
PROBLEM_LOOK = {
    "rank_lost": ("✖", "✖ LOST", "bold reverse $error"),
    "hang": ("❚", "❚ HANG", "bold reverse $error"),
    "straggler": ("▲", "▲ SLOW", "bold reverse $warning"),
}
#: An episode not updated for this long is over: relays repeat a lasting one every RELAY_REPEAT_S, so
#: this allows two updates to be lost on the way.
CURRENT_S = 3 * RELAY_REPEAT_S


@dataclass(frozen=True)
class Problem:
    """One episode of a relay's finding: about ``rank`` on ``host``, or a whole ``relay`` (rank None)."""

    id: str
    kind: str
    rank: int | None
    host: str
    relay: str | None
    step: int | None
    count: int
    ts: float
    current: bool
    message: str


def _problem(event: EventRecord, now: float) -> Problem:
    details = event.details
    relay = details.get("relay")
    rank = details.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool):
        rank = None if relay else event.rank  # a lost relay is about no rank: its node is marked
    host = details.get("host")
    return Problem(
        id=event.id,
        kind=event.kind,
        rank=rank,
        host=host if isinstance(host, str) else "",
        relay=relay if isinstance(relay, str) else None,
        step=event.step,
        count=event.count,
        ts=event.ts,
        current=now - event.ts <= CURRENT_S,
        message=event.message + (f" · latest: {event.latest_message}" if event.latest_message else ""),
    )


def job_problems(events: Iterable[EventRecord], now: float) -> list[Problem]:
    """The run's relay findings, newest update first (a lasting problem stays on top)."""
    found = [_problem(event, now) for event in events if event.kind in PROBLEM_KINDS]
    return sorted(found, key=lambda problem: problem.ts, reverse=True)


@dataclass(frozen=True)
class Marks:
    """The current problems as the grid needs them: by rank, and by node for a lost relay."""

    by_rank: Mapping[int, str]
    by_node: Mapping[str, str]

    def of(self, cell: Cell) -> str | None:
        """The most serious current problem of the cell's rank or node, if any."""
        of_rank = self.by_rank.get(cell.rank)
        of_node = self.by_node.get(cell.node) if self.by_node else None  # (called for every cell)
        return of_rank if of_node is None else _worse(of_rank, of_node)


def _worse(known: str | None, kind: str) -> str:
    return kind if known is None or PROBLEM_KINDS.index(kind) < PROBLEM_KINDS.index(known) else known


def current_marks(problems: Iterable[Problem]) -> Marks:
    """Marks of the current problems (a lost relay marks its whole node: nodes are named by host)."""
    by_rank: dict[int, str] = {}
    by_node: dict[str, str] = {}
    for problem in problems:
        if not problem.current:
            continue
        if problem.rank is None:
            by_node[problem.host] = _worse(by_node.get(problem.host), problem.kind)
        else:
            by_rank[problem.rank] = _worse(by_rank.get(problem.rank), problem.kind)
    return Marks(by_rank, by_node)
