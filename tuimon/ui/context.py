"""What a screen pushed from the dashboard gets to know: the selected event and its surroundings.

The incident screens and the event detail read the run through this value rather than through the
dashboard, so they never import it (no cycle between the dashboard and the screens it opens).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuimon.store import EventRecord, RunView, Store


@dataclass(frozen=True)
class EventContext:
    """An event with its surroundings, for screens pushed from the dashboard.

    ``window`` maps metric name to (steps, values) between ``event.step - before`` and
    ``event.step + after`` (see :meth:`Store.metric_window`); ``store`` lets a screen read more.
    """

    store: Store
    run: str
    run_view: RunView | None
    event: EventRecord
    window: dict[str, tuple[list[int], list[float]]]
