"""Invariant status table: rules every healthy run keeps (optimizer.step changes parameters, ...).

Rows are keyed by invariant name and updated in place with ``update_cell``; the table is never
cleared on a tick, so the cursor and scroll position stay where the user left them.
"""

from __future__ import annotations

from textual.content import Content

from tuimon.store import InvariantRecord
from tuimon.ui.dashboard.table import RowTable
from tuimon.ui.format import labelled

_STATUS = {
    "ok": ("✔ ok", "$success"),
    "violated": ("✖ VIOLATED", "bold reverse $error"),
    "unchecked": ("○ not yet checked", "$foreground 60%"),
}
_COLUMNS = (("status", 19), ("name", 22), ("since", 8), ("message", None))


def invariant_label(status: str) -> Content:
    return labelled(status, _STATUS)


class InvariantTable(RowTable):
    DEFAULT_CSS = """
    InvariantTable {
        border: round $primary 50%;
        border-title-color: $primary;
        border-title-style: bold;
        height: 1fr;
    }
    """

    # Read at a glance, not navigated: focus stays on the event log, whose keys are in the footer.
    can_focus = False

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: dict[str, InvariantRecord] = {}

    def on_mount(self) -> None:
        self.border_title = "Invariants (none reported yet)"
        for key, width in _COLUMNS:
            self.add_column(key, key=key, width=width)

    def reset(self) -> None:
        self.clear()
        self._shown = {}
        self.border_title = "Invariants (none reported yet)"

    def show(self, records: list[InvariantRecord]) -> None:
        for record in sorted(records, key=lambda r: r.name):
            cells = {
                "status": invariant_label(record.status),
                "name": record.name,
                "since": "—" if record.step is None else f"{record.step:,}",
                "message": record.message,
            }
            old = self._shown.get(record.name)
            if old is None:
                self.add_row(*cells.values(), key=record.name)
            elif old != record:
                for column, value in cells.items():
                    self.update_cell(record.name, column, value, update_width=True)
            self._shown[record.name] = record
        violated = sum(r.status == "violated" for r in records)
        if violated:
            self.border_title = f"Invariants  ✖ {violated} VIOLATED"
        else:
            self.border_title = "Invariants" if records else "Invariants (none reported yet)"
        self.rows_changed()
