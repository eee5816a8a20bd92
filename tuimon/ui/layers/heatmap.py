"""The layer heatmap: one row per layer (in model order), one column per layer sample (newest on
the right), each cell coloured by how far its value is from healthy for the statistic shown.

A silent training bug usually lives in a few layers: a frozen block, a dead ReLU stage, the first
layers' vanishing gradients. Every layer over time on one screen shows *where* (the row) and
*since when* (the column where its colour changed), which the global gradient norm cannot.
Cells follow the shared level look (:mod:`tuimon.ui.levels`): a colour from the theme's ramp,
and in the contrast theme also a block of the level's height. The layers an event names are
marked ``!`` beside their names; the cursor row is marked ``▶`` and its name drawn bold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.content import Content
from textual.message import Message
from textual.widget import Widget

from tuimon.store.layers import LayerMatrix
from tuimon.ui.format import number
from tuimon.ui.levels import LEVEL_GLYPHS, LEVELS, NO_DATA, NO_DATA_STYLE, ramp
from tuimon.ui.scroll import keep_visible
from tuimon.ui.themes import SYMBOL_THEMES

#: The widest layer name column (longer names keep their end: the part that tells layers apart).
MAX_LABEL = 34
#: The widest cell and the tallest row, when few samples or few layers leave room.
MAX_CELL_WIDTH = 8
MAX_ROW_HEIGHT = 3
#: A cell in the themes without symbols: a full block, so a row reads as a continuous strip.
SOLID = "█"
_LABEL_STYLE = "$foreground 70%"
_CURSOR_STYLE = "bold $accent"
_NAMED_STYLE = "bold $warning"


def short_label(name: str, width: int) -> str:
    """``name`` in ``width`` columns, its start elided (``…h.1.mlp.c_fc.weight``)."""
    return name if len(name) <= width else "…" + name[len(name) - width + 1:]


def level_of(badness: float) -> int:
    return min(max(round(badness * (LEVELS - 1)), 0), LEVELS - 1)


@dataclass(frozen=True)
class CellLook:
    """How cells look in one frame: a (glyph, style) per level."""

    levels: tuple[tuple[str, str], ...]

    @classmethod
    def of_theme(cls, name: str, variables: dict[str, str]) -> CellLook:
        colours = ramp(variables)
        symbols = name in SYMBOL_THEMES
        return cls(tuple((LEVEL_GLYPHS[i] if symbols else SOLID, colours[i]) for i in range(LEVELS)))

    def cell(self, badness: float | None) -> tuple[str, str]:
        return (NO_DATA, NO_DATA_STYLE) if badness is None else self.levels[level_of(badness)]


class LayerHeatmap(Widget, can_focus=True):
    """Layers × samples of one :class:`~tuimon.store.layers.LayerMatrix`; up/down move the cursor."""

    DEFAULT_CSS = """
    LayerHeatmap {
        border: round $primary 50%;
        border-title-color: $primary;
        border-title-style: bold;
        height: 1fr;
    }
    LayerHeatmap:focus {
        border: round $accent;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "move(-1)", "Layer above", show=False),
        Binding("down", "move(1)", "Layer below", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "move_to(0)", "First layer", show=False),
        Binding("end", "move_to(-1)", "Last layer", show=False),
    ]

    class CursorMoved(Message):
        """The cursor is on another layer (the screen's history follows it)."""

        def __init__(self, layer: str | None) -> None:
            super().__init__()
            self.layer = layer

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._matrix: LayerMatrix | None = None
        self.named: tuple[str, ...] = ()
        self.cursor_layer: str | None = None
        self._top = 0

    # ------------------------------------------------------------------------------ the data

    def show(self, matrix: LayerMatrix | None) -> None:
        """The heatmap to draw; the cursor stays on its layer while that layer is in it."""
        self._matrix = matrix
        layers = matrix.layers if matrix is not None else ()
        if self.cursor_layer not in layers:
            first = next((name for name in self.named if name in layers), None)
            self._set_cursor(first if first is not None else (layers[0] if layers else None))
        self._update_titles()
        self.refresh()

    def mark(self, named: tuple[str, ...]) -> None:
        """The layers an event names: marked, and the cursor put on the first of them."""
        self.named = named
        if named:
            self._set_cursor(named[0])

    @property
    def matrix(self) -> LayerMatrix | None:
        """What is drawn (the screen's latest read of the store)."""
        return self._matrix

    @property
    def layers(self) -> tuple[str, ...]:
        return self._matrix.layers if self._matrix is not None else ()

    def sample_columns(self) -> int:
        """How many samples fit beside the layer names (what the screen asks the store for)."""
        return max(self.size.width - self._label_width() - 2, 8)

    def _label_width(self) -> int:
        longest = max((len(name) for name in self.layers), default=12)
        return min(longest, MAX_LABEL, max(self.size.width // 3, 8))

    # ---------------------------------------------------------------------------- the cursor

    def _set_cursor(self, layer: str | None) -> None:
        if layer != self.cursor_layer:
            self.cursor_layer = layer
            self.post_message(self.CursorMoved(layer))

    def _move_to(self, index: int) -> None:
        layers = self.layers
        if layers:
            self._set_cursor(layers[min(max(index, 0), len(layers) - 1)])
            self._update_titles()
            self.refresh()

    @property
    def cursor(self) -> int:
        layers = self.layers
        return layers.index(self.cursor_layer) if self.cursor_layer in layers else 0

    def action_move(self, rows: int) -> None:
        self._move_to(self.cursor + rows)

    def action_page(self, pages: int) -> None:
        self._move_to(self.cursor + pages * max(self.size.height - 2, 1))

    def action_move_to(self, index: int) -> None:
        self._move_to(index if index >= 0 else len(self.layers) + index)

    def move_to_layer(self, layer: str) -> None:
        if layer in self.layers:
            self._move_to(self.layers.index(layer))

    # ------------------------------------------------------------------------------- drawing

    def _update_titles(self) -> None:
        matrix = self._matrix
        if matrix is None:
            self.border_title = "Layers"
            self.border_subtitle = ""
            return
        stat = matrix.statistic
        shape = f"{len(matrix.layers)} layers × {len(matrix.steps)} samples"
        self.border_title = f"Layers: {stat.label} ({shape})"
        layer = self.cursor_layer
        if layer is None:
            self.border_subtitle = ""
            return
        row = matrix.values[matrix.layers.index(layer)]
        latest = next((value for value in reversed(row) if value is not None), None)
        self.border_subtitle = f"▶ {layer}: {number(latest)} · enter: its history (or hide it)"

    def render(self) -> Content:
        matrix = self._matrix
        width, height = self.size
        if matrix is None or not matrix.layers:
            return Content.styled(
                "no layer samples yet: the publisher sends one every few steps, within its time budget",
                _LABEL_STYLE,
            )
        label_width = self._label_width()
        columns = max(width - label_width - 2, 1)
        shown_steps = matrix.steps[-columns:]
        # Few samples or few layers: wider cells and taller rows, so a small model fills the panel.
        cell_width = min(max(columns // max(len(shown_steps), 1), 1), MAX_CELL_WIDTH)
        rows_free = max(height - 1, 1)  # the step axis takes the last line
        row_height = min(max(rows_free // len(matrix.layers), 1), MAX_ROW_HEIGHT)
        rows_shown = max(rows_free // row_height, 1)
        cursor = self.cursor
        self._top = keep_visible(cursor, self._top, rows_shown, len(matrix.layers))
        look = CellLook.of_theme(self.app.theme, self.app.theme_variables)
        lines = []
        for index in range(self._top, min(self._top + rows_shown, len(matrix.layers))):
            cells = self._cells(matrix.badness[index][-columns:], look, cell_width)
            label = self._label(matrix.layers[index], index == cursor, label_width)
            lines.append(Content.assemble(*label, *cells))
            lines += [Content.assemble(" " * (label_width + 2), *cells)] * (row_height - 1)
        lines += [Content("")] * (rows_free - len(lines))
        lines.append(_step_axis(shown_steps, label_width + 2, cell_width, width))
        return Content("\n").join(lines)

    def _label(self, layer: str, here: bool, width: int) -> list[tuple[str, str]]:
        named = layer in self.named
        marker = "▶" if here else ("!" if named else " ")
        style = _CURSOR_STYLE if here else (_NAMED_STYLE if named else _LABEL_STYLE)
        return [(marker, _NAMED_STYLE if named and not here else _CURSOR_STYLE),
                (short_label(layer, width).ljust(width) + " ", style)]

    @staticmethod
    def _cells(badness: tuple[float | None, ...], look: CellLook, cell_width: int) -> list[tuple[str, str]]:
        """One row's cells as (text, style) pieces, runs of one style merged."""
        pieces: list[tuple[str, str]] = []
        for bad in badness:
            glyph, style = look.cell(bad)
            glyph *= cell_width
            if pieces and pieces[-1][1] == style:
                pieces[-1] = (pieces[-1][0] + glyph, style)
            else:
                pieces.append((glyph, style))
        return pieces


def _step_axis(steps: tuple[int, ...], indent: int, cell_width: int, width: int) -> Content:
    """``step 12 ……… 1,140``: the first and last sample's steps under their columns."""
    if not steps:
        return Content("")
    first, last = f"step {steps[0]:,}", f"{steps[-1]:,}"
    gap = len(steps) * cell_width - len(first) - len(last)
    text = first + " " * gap + last if gap >= 1 else first
    return Content.styled((" " * indent + text)[:width], _LABEL_STYLE)
