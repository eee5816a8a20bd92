"""The DataTable the dashboard's tables share: row cursor, and only the keys a row list needs.

DataTable's own left/right/home/end would swallow the replay's seek keys while a table has focus;
a row list has no use for them (cells never scroll sideways far enough to matter), so they are
left to the app.
"""

from __future__ import annotations

from typing import ClassVar

from textual import events
from textual.binding import Binding, BindingType
from textual.widgets import DataTable


class RowTable(DataTable, inherit_bindings=False):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select_cursor", "Details"),
        Binding("up", "cursor_up", "Cursor up", show=False),
        Binding("down", "cursor_down", "Cursor down", show=False),
        Binding("pageup", "page_up", "Page up", show=False),
        Binding("pagedown", "page_down", "Page down", show=False),
        Binding("ctrl+home", "scroll_top", "Top", show=False),
        Binding("ctrl+end", "scroll_bottom", "Bottom", show=False),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)

    def rows_changed(self) -> None:
        """Call after adding or updating rows from outside the table (the app's timers).

        A DataTable measures its auto-width columns when its own message queue goes idle; rows
        added from elsewhere leave that queue empty and untouched, and the columns kept the
        header's width until the next key press (seen as messages cut to a few characters).
        """
        self.check_idle()

    async def _on_idle(self, event: events.Idle) -> None:
        """DataTable's own idle work (measuring new rows and updated cells), then a redraw at the
        new widths when they changed.

        DataTable caches each rendered cell under a key that omits the column's width; a frame
        drawn between ``add_row`` and this measure (a busy event loop) cached the cells at the
        header's width, and nothing cleared them until the rows changed again: at the end of a
        replay the messages stayed cut to a few characters.
        """
        widths = [column.get_render_width(self) for column in self.ordered_columns]
        await super()._on_idle(event)
        event.prevent_default()  # DataTable's handler has run, above: not again
        if [column.get_render_width(self) for column in self.ordered_columns] != widths:
            self._clear_caches()
            self.refresh()
