"""Event log: anomaly episodes in the order they began, newest at the bottom.

An episode that repeats is re-sent with the same id and a higher count; its row is updated in
place. Until the user takes the cursor (moves it, or focuses the log with ``e`` to pick an event)
it follows new events to the bottom; from then on it stays on its event, by the event's id,
whatever arrives: rows added below it, the oldest rows dropped above it. The row ``enter`` opens
is then the one the user was looking at, never one that arrived a moment before the key press.
"""

from __future__ import annotations

from rich.text import Text
from textual.content import Content

from tuimon.store import EventRecord
from tuimon.ui.format import severity
from tuimon.ui.table import RowTable

#: Rows the log keeps: the latest episodes (the store keeps more; detectors fold repeats, so this
#: is reached only in a flood). Removing a row costs the DataTable a pass over all of them.
MAX_ROWS = 500
# (key, label, width)
_COLUMNS = (
    ("severity", "sev", 6),
    ("step", "step", 8),
    ("kind", "kind", None),
    ("count", "count", 5),
    ("message", "message", None),
)


def _message(record: EventRecord) -> Text:
    """What set the episode off, then its latest repeat, dimmed (a peer's text: never markup)."""
    text = Text(record.message)
    if record.latest_message is not None:
        at = "" if record.latest_step is None else f" at step {record.latest_step:,}"
        text.append(f"  · latest{at}: {record.latest_message}", style="dim")
    return text


class EventLog(RowTable):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: dict[str, EventRecord] = {}
        #: True once the user took the cursor: it stays on its event instead of following new ones.
        self.held = False
        self._placed: str | None = None  # the event this log last put the cursor on

    def on_mount(self) -> None:
        self.framed_by.border_title = "Events"
        self.framed_by.border_subtitle = "enter: details"
        for key, label, width in _COLUMNS:
            self.add_column(label, key=key, width=width)

    def reset(self) -> None:
        self.clear()
        self._shown = {}
        self.held = False
        self._placed = None

    def hold(self) -> None:
        """Keep the cursor on the event it is on (the user is about to pick one)."""
        self.held = True

    def row_detail(self, key: str) -> Content:
        record = self._shown.get(key)
        if record is None:
            return Content("")
        step = "" if record.step is None else f" at step {record.step:,}"
        head = Content.assemble(severity(record.severity), " ", (record.kind, "bold"))
        update = record.update_text()
        return head + Content(f"{step}: {record.message}" + (f" ({update})" if update else ""))

    def show(self, records: list[EventRecord]) -> None:
        """Add new episodes, update repeated ones in place; keep the latest :data:`MAX_ROWS`."""
        if self.highlighted_key != self._placed:
            self.held = True  # the user moved the cursor since this log last placed it
        kept = self.highlighted_key
        latest = records[-MAX_ROWS:]
        for record in latest:
            old = self._shown.get(record.id)
            if old is None:
                self.add_row(
                    severity(record.severity),
                    "—" if record.step is None else f"{record.step:,}",
                    Text(record.kind),  # a peer's text: never read as markup
                    f"×{record.count}",
                    _message(record),
                    key=record.id,
                )
            elif old != record:
                self.update_cell(record.id, "count", f"×{record.count}")
                self.update_cell(record.id, "message", _message(record), update_width=True)
                self.update_cell(record.id, "severity", severity(record.severity))
            self._shown[record.id] = record
        for old_id in list(self._shown)[: max(0, len(self._shown) - MAX_ROWS)]:  # the oldest go
            del self._shown[old_id]
            self.remove_row(old_id)
        self._place_cursor(kept)
        critical = sum(r.severity == "critical" for r in records)
        title = f"Events ({len(records):,}, {critical:,} critical)" if records else "Events"
        if len(records) > len(self._shown):
            title += f"  latest {len(self._shown):,} shown"
        self.framed_by.border_title = title
        self.rows_changed()

    def _place_cursor(self, kept: str | None) -> None:
        """The cursor on event ``kept`` while the user holds it, else on the newest event (a held
        event whose row was dropped as one of the oldest gives way to the oldest one left)."""
        if not self.row_count:
            return
        if not self.held:
            row = self.row_count - 1
        elif kept in self._shown:
            row = self.get_row_index(kept)
        else:
            row = 0
        if row != self.cursor_row:
            self.move_cursor(row=row, animate=False)
        self._placed = self.highlighted_key
