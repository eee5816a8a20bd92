"""The job grid: one cell per GPU (per rank without GPUs), grouped by node, coloured by a figure.

In synchronous data parallelism the whole job runs at the pace of its slowest rank, so what a
user of a big job needs first is the one GPU in thousands that differs, and where it is: every
GPU on one screen, as a heatmap, with the relays' findings marked on their cells (a symbol, never
only a colour). Cells are grouped by node because a node is what fails, gets drained or
restarted. The cursor brackets a node (``[ ]``) instead of recolouring it, so its cells keep
showing their values.

The grid is drawn from the latest :class:`~tuimon.store.JobView` handed to :meth:`JobGrid.show`
and redrawn only when that, the marks, the figure, the cursor, the size or the theme change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.content import Content
from textual.widget import Widget

from tuimon.store import Cell, JobView, NodeView
from tuimon.ui.job.layout import NODE_GROUP, GridLayout, choose_layout, short_name
from tuimon.ui.job.legend import legend
from tuimon.ui.job.metrics import GRID_METRICS, LEVELS, GridMetric, next_metric
from tuimon.ui.job.palette import Palette
from tuimon.ui.job.problems import PROBLEM_KINDS, PROBLEM_LOOK, Marks
from tuimon.ui.levels import NO_DATA, NO_DATA_STYLE
from tuimon.ui.scroll import keep_visible

_CURSOR_STYLE = "bold $accent"
_LABEL_STYLE = "$foreground 50%"
#: The node under the cursor when a node is one character.
_CURSOR_CELL = "◆"
#: A problem's (symbol, style) in a cell.
_MARKS = {kind: (symbol, style) for kind, (symbol, _, style) in PROBLEM_LOOK.items()}


@dataclass
class GridState:
    """What the grid remembers between two openings of the job view: the figure and the node."""

    metric: str = "util"
    cursor: str | None = None  # the node's name: it stays on its node when others join


@dataclass
class _Row:
    """One line of the grid being assembled: (text, style) pieces, equal styles merged."""

    pieces: list[tuple[str, str]] = field(default_factory=list)

    def add(self, text: str, style: str) -> None:
        if self.pieces and self.pieces[-1][1] == style:
            self.pieces[-1] = (self.pieces[-1][0] + text, style)
        else:
            self.pieces.append((text, style))

    def content(self) -> Content:
        return Content.assemble(*self.pieces)


@dataclass(frozen=True)
class _Painter:
    """How cells and nodes look in one frame: a problem's mark, else the value's level."""

    metric: GridMetric
    scale: tuple[float, float]
    marks: Marks
    #: (glyph, style) of each level.
    levels: tuple[tuple[str, str], ...]

    def cell(self, cell: Cell) -> tuple[str, str]:
        kind = self.marks.of(cell)
        if kind is not None:
            return _MARKS[kind]
        value = self.metric.value(cell)
        if value is None:
            return NO_DATA, NO_DATA_STYLE
        return self.levels[self.metric.level(value, self.scale)]

    def node(self, node: NodeView) -> tuple[str, str]:
        """A node as one character: its most serious mark, else its worst value."""
        kinds = [kind for cell in node.cells if (kind := self.marks.of(cell))]
        if kinds:
            return _MARKS[min(kinds, key=PROBLEM_KINDS.index)]
        values = [v for cell in node.cells if (v := self.metric.value(cell)) is not None]
        if not values:
            return NO_DATA, NO_DATA_STYLE
        return self.levels[self.metric.level(self.metric.worst(values), self.scale)]


class JobGrid(Widget, can_focus=True):
    """Every node of the job; ``state`` keeps the figure and cursor for the next opening."""

    DEFAULT_CSS = """
    JobGrid {
        border: round $primary 50%;
        border-title-color: $primary;
        border-title-style: bold;
        height: 1fr;
    }
    JobGrid:focus {
        border: round $accent;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "move(-1)", "Previous node", show=False),
        Binding("right", "move(1)", "Next node", show=False),
        Binding("up", "move_rows(-1)", "Node above", show=False),
        Binding("down", "move_rows(1)", "Node below", show=False),
        Binding("home", "move_to(0)", "First node", show=False),
        Binding("end", "move_to(-1)", "Last node", show=False),
    ]

    def __init__(self, state: GridState, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.state = state
        self._view: JobView | None = None
        self._marks = Marks({}, {})
        self._layout: GridLayout | None = None
        self._top = 0  # first row shown when the rows do not fit

    # ------------------------------------------------------------------------------ the data

    def show(self, view: JobView, marks: Marks) -> None:
        """The job as it is now; redraws only if it differs from what is drawn."""
        if view is self._view and marks == self._marks:  # the screen hands a new view when it changed
            return
        self._view, self._marks = view, marks
        if self.state.cursor not in {node.name for node in view.nodes}:
            self.state.cursor = view.nodes[0].name if view.nodes else None
        self._changed()

    @property
    def metric(self) -> GridMetric:
        return GRID_METRICS[self.state.metric]

    def next_metric(self) -> None:
        self.state.metric = next_metric(self.state.metric)
        self._changed()

    @property
    def nodes(self) -> tuple[NodeView, ...]:
        return self._view.nodes if self._view is not None else ()

    @property
    def cursor(self) -> int:
        """Index of the node under the cursor."""
        names = [node.name for node in self.nodes]
        return names.index(self.state.cursor) if self.state.cursor in names else 0

    @property
    def cursor_node(self) -> NodeView | None:
        return self.nodes[self.cursor] if self.nodes else None

    def _changed(self) -> None:
        self._update_titles()
        self.refresh()

    # ---------------------------------------------------------------------------- the cursor

    def _move_to(self, index: int) -> None:
        if self.nodes:
            self.state.cursor = self.nodes[min(max(index, 0), len(self.nodes) - 1)].name
            self._changed()

    def action_move(self, step: int) -> None:
        self._move_to(self.cursor + step)

    def action_move_rows(self, rows: int) -> None:
        per_row = self._layout.per_row if self._layout is not None else 1
        target = self.cursor + rows * per_row
        if 0 <= target < len(self.nodes):
            self._move_to(target)

    def action_move_to(self, index: int) -> None:
        self._move_to(index if index >= 0 else len(self.nodes) + index)

    # ------------------------------------------------------------------------------- drawing

    def _update_titles(self) -> None:
        self.border_title = f"Job grid: {self.metric.title}"
        node = self.cursor_node
        if node is None:
            self.border_subtitle = ""
            return
        ranks = f"rank {node.ranks[0]}" if len(node.ranks) == 1 else f"ranks {node.ranks[0]}-{node.ranks[-1]}"
        values = [v for cell in node.cells if (v := self.metric.value(cell)) is not None]
        shown = ""
        if values:
            low, high = self.metric.text(min(values)), self.metric.text(max(values))
            shown = f" · {self.metric.title} {low}" + (f" to {high}" if high != low else "")
        flagged = sum(self._marks.of(cell) is not None for cell in node.cells)
        problems = f" · {flagged} flagged" if flagged else ""
        where = f"▶ node {self.cursor}: {node.name} · {ranks}"
        self.border_subtitle = f"{where}{shown}{problems} · enter: its ranks"

    def _row(self, layout: GridLayout, number: int, paint: _Painter, widest: int) -> Content:
        """Row ``number``: its label, then its nodes (``widest``: columns of the largest node's cells)."""
        first = number * layout.per_row
        indices = range(first, min(first + layout.per_row, len(self.nodes)))
        cursor = self.cursor
        row = _Row()
        if layout.label_width:
            here = cursor in indices
            label = f"{'▶' if here else ' '}{first:>{layout.label_width - 1}}"
            row.add(label, _CURSOR_STYLE if here else _LABEL_STYLE)
        if layout.mode == "nodes":
            for index in indices:
                if (index - first) % NODE_GROUP == 0:
                    row.add(" ", "")
                look = (_CURSOR_CELL, _CURSOR_STYLE) if index == cursor else paint.node(self.nodes[index])
                row.add(*look)
            return row.content()
        for index in indices:
            node = self.nodes[index]
            row.add(*_separator(index, cursor, row_start=index == first))
            if layout.mode == "named":
                row.add(short_name(node.name).ljust(layout.name_width) + " ",
                        _CURSOR_STYLE if index == cursor else _LABEL_STYLE)
            for position, cell in enumerate(node.cells):
                glyph, style = paint.cell(cell)
                if layout.cell_width > 1:
                    glyph *= layout.cell_width - 1
                    if position:
                        row.add(" ", "")
                row.add(glyph, style)
            row.add(" " * (widest - layout.cells_width(len(node.cells))), "")
        row.add("]" if indices[-1] == cursor else " ", _CURSOR_STYLE)  # the row's last node closes it
        return row.content()

    def render(self) -> Content:
        nodes = self.nodes
        width, height = self.size
        if not nodes or width < 4:
            return Content.styled("no node summaries yet", _LABEL_STYLE)
        rows_shown = max(height - 1, 1)  # the legend takes the last line at least
        layout = choose_layout(len(nodes), max(len(node.cells) for node in nodes),
                               [node.name for node in nodes], width, rows_shown)
        self._layout = layout
        cells = [cell for node in nodes for cell in node.cells]
        metric = self.metric
        scale = metric.scale(cells)
        palette = Palette.of_theme(self.app.theme, self.app.theme_variables)
        levels = tuple((palette.glyph(level), palette.style(metric, level)) for level in range(LEVELS))
        paint = _Painter(metric, scale, self._marks, levels)
        widest = layout.cells_width(max(len(node.cells) for node in nodes))
        self._top = keep_visible(layout.row_of(self.cursor), self._top, rows_shown, layout.rows)
        end = min(layout.rows, self._top + rows_shown)
        lines = [self._row(layout, number, paint, widest) for number in range(self._top, end)]
        spare = height - len(lines)  # the legend spreads over the rows the grid leaves free
        key = legend(self.metric, scale, palette, cells, layout, (self._top, end), width, spare)
        lines += [Content("")] * (spare - len(key)) + key
        return Content("\n").join(lines)


def _separator(index: int, cursor: int, *, row_start: bool = False) -> tuple[str, str]:
    """What goes before node ``index``: brackets around the node under the cursor, else a space
    (the last node of a row closes its bracket at the end of its own row)."""
    if index == cursor:
        return "[", _CURSOR_STYLE
    if index - 1 == cursor and not row_start:
        return "]", _CURSOR_STYLE
    return " ", ""
