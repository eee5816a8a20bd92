"""One node of the job: its ranks and GPUs with their figures; ``enter`` on a rank picks it.

Opened from the job grid's cursor. It reads the store on its own timer and updates its rows in
place when the node's summary changed, so the cursor stays on the row the user is reading.
Dismissed with the chosen rank (the dashboard then shows that rank's own series) or None (back).
"""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.content import Content
from textual.screen import Screen
from textual.widgets import DataTable, Static

from tuimon.store import Cell, NodeView, Store
from tuimon.ui.footer import FittedFooter
from tuimon.ui.format import number
from tuimon.ui.job.metrics import GRID_METRICS
from tuimon.ui.job.problems import PROBLEM_LOOK, current_marks, job_problems
from tuimon.ui.table import RowTable

#: Redraws a second at most (node summaries come twice a second).
REFRESH_HZ = 2.0
#: The problem comes right after the rank, so that an 80-column terminal shows it without scrolling.
_COLUMNS = (("rank", 6), ("GPU", 4), ("problem", 8), ("step", 9), ("step time", 10), ("data wait", 10),
            ("compute", 10), ("loss", 9), ("util", 6), ("mem", 6), ("temp", 6))


def _figure(cell: Cell, key: str) -> str:
    metric = GRID_METRICS.get(key)
    value = metric.value(cell) if metric is not None else cell.values.get(key)
    if value is None or value != value:  # absent or NaN
        return "—"
    return metric.text(value) if metric is not None else number(value)


#: A table row: the rank it is of, and its cells.
Row = tuple[int, tuple[object, ...]]


def node_rows(node: NodeView, marks_of: dict[int, str]) -> dict[str, Row]:
    """Row key -> rank and cells of each GPU (each rank without one) of ``node``, in rank order."""
    steps = dict(zip(node.ranks, node.steps, strict=False))
    rows: dict[str, Row] = {}
    for cell in node.cells:
        step = steps.get(cell.rank)
        kind = marks_of.get(cell.rank)
        problem = Content.styled(PROBLEM_LOOK[kind][1], PROBLEM_LOOK[kind][2]) if kind else Content("")
        rows[f"{cell.rank}/{cell.index}"] = cell.rank, (
            str(cell.rank),
            "—" if cell.index is None else str(cell.index),
            problem,
            "—" if step is None else f"{step:,}",
            _figure(cell, "step_time"),
            _figure(cell, "data_time"),
            _figure(cell, "compute_time"),
            _figure(cell, "loss"),
            _figure(cell, "util"),
            _figure(cell, "mem"),
            _figure(cell, "temp_c"),
        )
    return rows


class NodeTable(RowTable):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select_cursor", "This rank", tooltip="The dashboard, its charts of this rank"),
    ]
    DEFAULT_CSS = """
    NodeTable {
        border: round $accent;
        border-title-color: $accent;
        border-title-style: bold;
        height: 1fr;
    }
    """


class NodeScreen(Screen[int | None]):
    """The node named ``node`` of ``run``, read from ``store``."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back to the grid", tooltip="Back to the job grid"),
    ]
    DEFAULT_CSS = """
    NodeScreen #node-header {
        height: 1;
        background: $panel;
        padding: 0 1;
    }
    """

    def __init__(self, store: Store, run: str, node: str) -> None:
        super().__init__()
        self.store = store
        self.run = run
        self.node = node
        self._drawn: object = None
        self._ranks: dict[str, int] = {}

    def compose(self) -> ComposeResult:
        yield Static(id="node-header")
        yield NodeTable(id="node-table")
        yield FittedFooter()

    def on_mount(self) -> None:
        table = self.query_one(NodeTable)
        for label, width in _COLUMNS:
            table.add_column(label, key=label, width=width)
        table.border_subtitle = "enter: this rank's own charts on the dashboard"
        table.focus()
        self.refresh_rows()
        self.set_interval(1 / REFRESH_HZ, self.refresh_rows)

    def refresh_rows(self) -> None:
        """The node's rows, when its summary or the problems changed."""
        versions = self.store.versions(self.run)
        now = self.store.now()
        key = (versions["nodes"], versions["events"], int(now))
        if key == self._drawn or not self.is_current:
            return
        self._drawn = key
        view = self.store.job_view(self.run)
        node = next((n for n in view.nodes if n.name == self.node), None) if view else None
        if view is None or node is None:
            self.query_one("#node-header", Static).update(f"node {self.node}: no summary of it any more")
            return
        marks = current_marks(job_problems(self.store.events(self.run), now))
        rows = node_rows(node, {cell.rank: kind for cell in node.cells if (kind := marks.of(cell))})
        self._show(rows)
        index = [n.name for n in view.nodes].index(node.name)
        gpus = sum(cell.index is not None for cell in node.cells)
        self.query_one("#node-header", Static).update(Content.assemble(
            ("node ", "$foreground 70%"), (f"{index} of {len(view.nodes)}: ", "$foreground 70%"),
            (node.name, "bold $accent"), f"  │  {len(node.ranks)} ranks, {gpus} GPUs of run ",
            (self.run, "bold"),
        ))

    def _show(self, rows: dict[str, Row]) -> None:
        table = self.query_one(NodeTable)
        if list(rows) != list(self._ranks):
            table.clear()
            for key, (_, cells) in rows.items():
                table.add_row(*cells, key=key)
        else:
            for key, (_, cells) in rows.items():
                for (label, _), value in zip(_COLUMNS, cells, strict=True):
                    table.update_cell(key, label, value)
        self._ranks = {key: rank for key, (rank, _) in rows.items()}
        table.border_title = f"Ranks and GPUs ({len(rows)})"
        table.rows_changed()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        rank = self._ranks.get(event.row_key.value or "")
        self.dismiss(rank)

    def action_back(self) -> None:
        self.dismiss(None)
