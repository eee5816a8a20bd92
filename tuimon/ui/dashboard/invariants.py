"""Invariant status table: rules every healthy run keeps (optimizer.step changes parameters, ...).

Rows are keyed by invariant name and updated in place with ``update_cell``; the table is never
cleared on a tick, so the cursor and scroll position stay where the user left them.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.binding import BindingType
from textual.content import Content

from tuimon.store import InvariantRecord
from tuimon.ui.format import labelled
from tuimon.ui.table import NAVIGATION, RowTable

_STATUS = {
    "ok": ("✔ ok", "$success"),
    "violated": ("✖ VIOLATED", "bold reverse $error"),
    "unchecked": ("○ unchecked", "$foreground 60%"),
}
_COLUMNS = (("status", 11), ("name", None), ("since", 7), ("message", None))


def invariant_label(status: str) -> Content:
    return labelled(status, _STATUS)


class InvariantTable(RowTable, inherit_bindings=False):
    """Read at a glance; tab moves the cursor here to read a row's message on the detail line."""

    BINDINGS: ClassVar[list[BindingType]] = NAVIGATION

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: dict[str, InvariantRecord] = {}

    def on_mount(self) -> None:
        self.framed_by.border_title = "Invariants (none reported yet)"
        for key, width in _COLUMNS:
            self.add_column(key, key=key, width=width)

    def reset(self) -> None:
        self.clear()
        self._shown = {}
        self.framed_by.border_title = "Invariants (none reported yet)"

    def row_detail(self, key: str) -> Content:
        record = self._shown.get(key)
        if record is None:
            return Content("")
        since = "" if record.step is None else f" (step {record.step:,})"
        head = Content.assemble(invariant_label(record.status), " ", (record.name, "bold"), since)
        return head + Content(f": {record.message}")

    def show(self, records: list[InvariantRecord]) -> None:
        """Add new invariants, update changed ones in place; a newly violated one is put under the
        cursor (its message on the detail line) unless the user is reading this table."""
        newly_violated = None
        for record in sorted(records, key=lambda r: r.name):
            cells = {
                "status": invariant_label(record.status),
                "name": Text(record.name),  # a peer's text: never read as markup
                "since": "—" if record.step is None else f"{record.step:,}",
                "message": Text(record.message),
            }
            old = self._shown.get(record.name)
            if old is None:
                self.add_row(*cells.values(), key=record.name)
            elif old != record:
                for column, value in cells.items():
                    self.update_cell(record.name, column, value, update_width=True)
            if record.status == "violated" and (old is None or old.status != "violated"):
                newly_violated = newly_violated or record.name
            self._shown[record.name] = record
        if newly_violated is not None and not self.has_focus:
            self.move_cursor(row=self.get_row_index(newly_violated))
        violated = sum(r.status == "violated" for r in records)
        if violated:
            title = f"Invariants  ✖ {violated} VIOLATED"
        else:
            title = "Invariants" if records else "Invariants (none reported yet)"
        self.framed_by.border_title = title
        self.rows_changed()
