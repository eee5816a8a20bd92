"""The DataTable the UI's row lists share (the dashboard's tables, the job view's node and problem
lists), and the bordered panel that shows its row in full.

DataTable's own left/right/home/end would swallow the replay's seek keys while a table has focus;
a row list has no use for them (cells never scroll sideways far enough to matter), so they are
left to the screen.

A table cell is one line cut at its column's width, and a message is the one thing a user needs
whole: :class:`TablePanel` puts a wrapping *detail line* under the table with the highlighted
row's full text (the pattern of ``htop``'s and ``k9s``' describe line), so messages are never read
as their first dozen characters while half the panel is empty.
"""

from __future__ import annotations

from typing import ClassVar

from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.widget import Widget
from textual.widgets import DataTable, Static

#: Moving in a row list; tables whose rows open something add ``enter`` (:class:`RowTable`).
NAVIGATION: list[BindingType] = [
    Binding("up", "cursor_up", "Cursor up", show=False),
    Binding("down", "cursor_down", "Cursor down", show=False),
    Binding("pageup", "page_up", "Page up", show=False),
    Binding("pagedown", "page_down", "Page down", show=False),
    Binding("ctrl+home", "scroll_top", "Top", show=False),
    Binding("ctrl+end", "scroll_bottom", "Bottom", show=False),
]


class RowTable(DataTable, inherit_bindings=False):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter", "select_cursor", "Details"), *NAVIGATION]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)

    @property
    def highlighted_key(self) -> str | None:
        """The key of the row under the cursor, if any."""
        if not self.row_count:
            return None
        return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value

    def row_detail(self, key: str) -> Content:
        """The full text of row ``key`` for the detail line (tables in a :class:`TablePanel`)."""
        return Content(key)

    @property
    def framed_by(self) -> Widget:
        """What carries the border and its titles: the panel when the table sits in one."""
        return self.parent if isinstance(self.parent, TablePanel) else self

    def rows_changed(self) -> None:
        """Call after adding or updating rows from outside the table (a screen's timers).

        A DataTable measures its auto-width columns when its own message queue goes idle; rows
        added from elsewhere leave that queue empty and untouched, and the columns kept the
        header's width until the next key press (seen as messages cut to a few characters).
        """
        self.check_idle()
        self._show_detail()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail()

    def _show_detail(self) -> None:
        if isinstance(self.parent, TablePanel):
            key = self.highlighted_key
            self.parent.show_detail(self.row_detail(key) if key is not None else Content(""))

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


class TablePanel(Vertical):
    """A bordered :class:`RowTable` with the highlighted row's full text wrapped under it."""

    DEFAULT_CSS = """
    TablePanel {
        border: round $primary 50%;
        border-title-color: $primary;
        border-title-style: bold;
        height: 1fr;
    }
    TablePanel:focus-within {
        border: round $accent;
    }
    TablePanel > RowTable {
        height: 1fr;
        overflow-x: hidden;  /* what a cell cuts, the detail line shows */
    }
    TablePanel > .row-detail {
        height: auto;
        max-height: 4;
        padding: 0 1;
        background: $boost;
        color: $foreground 90%;
    }
    """

    def __init__(self, table: RowTable, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.table = table

    def compose(self) -> ComposeResult:
        yield self.table
        yield Static(classes="row-detail")

    def show_detail(self, text: Content) -> None:
        self.query_one(".row-detail", Static).update(text)
