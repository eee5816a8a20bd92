"""The layer panel: the heatmap of layers × samples for one statistic, the worst layers now, and
the history of the layer under the cursor.

Opened from the dashboard (``h``) or from an event's details, in which case the layers the event
names are marked and the statistic is the one that shows that kind of event (a dead-activation
event opens on the dead fraction). Like the other screens it reads the store on a timer and
redraws when the run's layer samples moved (``versions(run)["layers"]``); it never imports the
dashboard that opens it.
"""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Static

from tuimon.store import Store
from tuimon.store.layers import STATISTIC_KEYS, LayerMatrix
from tuimon.ui.footer import FittedFooter
from tuimon.ui.format import number
from tuimon.ui.layers.heatmap import CellLook, LayerHeatmap, short_label
from tuimon.ui.layers.history import LayerHistoryChart

#: Redraws a second at most (samples come every few steps).
REFRESH_HZ = 2.0
#: Layers listed as the worst ones.
WORST_SHOWN = 8
_DIM = "$foreground 70%"


def worst_lines(matrix: LayerMatrix | None, look: CellLook, width: int) -> list[Content]:
    """The worst layers of the latest sample, worst first, each as its cell, name and value."""
    if matrix is None or not matrix.layers:
        return [Content.styled("no layer samples yet", _DIM)]
    stat = matrix.statistic
    lines = [Content.styled("Worst now", "bold $primary"), Content.styled(f"colour: {stat.rule}", _DIM)]
    worst = matrix.worst(WORST_SHOWN)
    if not worst:
        lines.append(Content.styled("no layer stands out in the latest sample", "$success"))
    for layer, value, badness in worst:
        name_width = max(width - 14, 8)
        name = short_label(layer, name_width)
        glyph, style = look.cell(badness)
        lines.append(Content.assemble((glyph, style), " ", (name.ljust(name_width), "bold"),
                                      f" {number(value):>10}"))
    return lines


class LayerScreen(Screen[None]):
    """Layer samples of ``run`` (of ``rank``, else the lowest rank that sent any) in ``store``;
    ``named`` layers (an event's) are marked and ``statistic`` is shown first."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("m", "next_statistic", "Statistic",
                tooltip="Next statistic: grad norm, update ratio, activation std, dead, NaN/Inf"),
        Binding("enter", "toggle_history", "History", tooltip="Show or hide the cursor layer's history"),
        Binding("w", "worst", "Worst", tooltip="Put the cursor on the worst layer now"),
        Binding("escape", "close", "Dashboard", tooltip="Back to the dashboard"),
        Binding("h", "close", "Dashboard", show=False, tooltip="Back to the dashboard"),
    ]
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]  # noqa: RUF012 (Textual declares it a list)
    DEFAULT_CSS = """
    LayerScreen #layers-header {
        height: auto;  /* wraps rather than cut on a small terminal */
        background: $panel;
        padding: 0 1;
    }
    LayerScreen #layers-main {
        height: 1fr;
    }
    LayerScreen LayerHeatmap {
        width: 1fr;
    }
    LayerScreen #layers-worst {
        width: 46;
        height: 1fr;
        border: round $primary 50%;
        padding: 0 1;
    }
    LayerScreen.-narrow #layers-main {
        layout: vertical;
    }
    LayerScreen.-narrow #layers-worst {
        width: 1fr;
        height: 7;
    }
    LayerScreen #layers-history {
        display: none;
    }
    LayerScreen.-history #layers-history {
        display: block;
    }
    LayerScreen.-narrow.-history #layers-worst {
        display: none;
    }
    """

    def __init__(
        self,
        store: Store,
        run: str,
        *,
        rank: int | None = None,
        statistic: str = STATISTIC_KEYS[0],
        named: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        self.store = store
        self.run = run
        self.rank = rank
        self.statistic = statistic
        #: The layers the event it was opened for names (marked ``!``).
        self.named = named
        self._matrix: LayerMatrix | None = None
        self._drawn: object = None

    def compose(self) -> ComposeResult:
        yield Static(id="layers-header")
        with Horizontal(id="layers-main"):
            yield LayerHeatmap(id="layers-heatmap")
            yield Static(id="layers-worst")
        yield LayerHistoryChart(id="layers-history")
        yield FittedFooter()

    def on_mount(self) -> None:
        heatmap = self.query_one(LayerHeatmap)
        heatmap.mark(self.named)
        heatmap.focus()
        self.refresh_view()
        self.set_interval(1 / REFRESH_HZ, self.refresh_view)

    @property
    def history_shown(self) -> bool:
        return self.has_class("-history")

    def refresh_view(self, *, force: bool = False) -> None:
        """Heatmap, worst list and history, when the samples, the statistic or the size moved."""
        if not self.is_current and not force:
            return
        heatmap = self.query_one(LayerHeatmap)
        columns = heatmap.sample_columns()
        key = (self.store.versions(self.run)["layers"], self.statistic, columns, self.app.theme)
        if key != self._drawn:
            self._drawn = key
            self._matrix = self.store.layer_matrix(self.run, self.statistic, rank=self.rank, last=columns)
            heatmap.show(self._matrix)
            self._show_header()
            worst = self.query_one("#layers-worst", Static)
            look = CellLook.of_theme(self.app.theme, self.app.theme_variables)
            worst.update(Content("\n").join(worst_lines(self._matrix, look, worst.content_size.width or 44)))
        if self.history_shown:
            self.query_one(LayerHistoryChart).show(self._matrix, heatmap.cursor_layer)

    def _show_header(self) -> None:
        matrix = self._matrix
        if matrix is None:
            text = Content.assemble(("Layers", "bold"), (f" of run {self.run}: no layer samples yet", _DIM))
        else:
            steps = f"steps {matrix.steps[0]:,}-{matrix.steps[-1]:,}" if matrix.steps else "no samples"
            rank = "" if self.rank is None else f" rank {self.rank},"
            text = Content.assemble(
                ("Layers", "bold"), (f" of run {self.run},{rank} {steps}  │  ", _DIM),
                (matrix.statistic.label, "bold $accent"), (f" (colour: {matrix.statistic.rule})", _DIM),
                ("  │  m: next statistic", _DIM),
            )
        self.query_one("#layers-header", Static).update(text)

    def on_resize(self) -> None:
        self.refresh_view(force=True)

    @on(LayerHeatmap.CursorMoved)
    def _cursor_moved(self) -> None:
        if self.history_shown:
            self.query_one(LayerHistoryChart).show(self._matrix, self.query_one(LayerHeatmap).cursor_layer)

    # ----------------------------------------------------------------------------------- actions

    def action_next_statistic(self) -> None:
        keys = list(STATISTIC_KEYS)
        self.statistic = keys[(keys.index(self.statistic) + 1) % len(keys)]
        self.refresh_view(force=True)

    def action_toggle_history(self) -> None:
        self.set_class(not self.history_shown, "-history")
        self.refresh_view(force=True)

    def action_worst(self) -> None:
        worst = self._matrix.worst(1) if self._matrix is not None else []
        if not worst:
            self.notify("no layer stands out in the latest sample", timeout=3)
            return
        self.query_one(LayerHeatmap).move_to_layer(worst[0][0])

    def action_close(self) -> None:
        self.dismiss(None)


def key_section() -> tuple[str, list[tuple[str, str]]]:
    """The layer panel's keys, as the help screen lists them."""
    keys = [("↑ ↓ pgup pgdn", "Move over the layers (home, end: the first, the last)")]
    keys += [(binding.key, binding.tooltip or binding.description)
             for binding in LayerScreen.BINDINGS if isinstance(binding, Binding) and binding.show]
    keys.append(("! ▶", "A layer the event names; the cursor"))
    return "Layer panel (h)", keys
