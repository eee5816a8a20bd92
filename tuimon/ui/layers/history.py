"""One layer's history for the statistic shown: a plotext line over the samples' steps.

Drawn with the axis helpers every chart shares (:mod:`tuimon.ui.plot`), on a log axis for
the statistics that span decades (gradient norm, update ratio, activation std), where a layer
whose gradient fell by 1000x is a drop of three rows and not a line flat on zero.
"""

from __future__ import annotations

import math

from textual_plotext import PlotextPlot

from tuimon.store.layers import LayerMatrix
from tuimon.ui.format import number
from tuimon.ui.plot import set_y_axis, theme_rgb


class LayerHistoryChart(PlotextPlot):
    DEFAULT_CSS = """
    LayerHistoryChart {
        border: round $primary 50%;
        border-title-color: $primary;
        border-title-style: bold;
        height: 12;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._drawn: object = None
        self._shown: tuple[LayerMatrix | None, str | None] = (None, None)

    def on_resize(self) -> None:
        """Drawn again at its new size: its y ticks are chosen for its height (the screen's own
        timer may not come round before the next frame)."""
        self.show(*self._shown)

    @property
    def drawn_at_size(self) -> bool:
        """Whether what is drawn was drawn at the widget's present size."""
        return isinstance(self._drawn, tuple) and self._drawn[-2] == self.size

    def show(self, matrix: LayerMatrix | None, layer: str | None) -> None:
        """``layer``'s values in ``matrix``; redrawn only when they, the size or the theme changed."""
        self._shown = (matrix, layer)
        steps, values = matrix.history(layer) if matrix is not None and layer is not None else ([], [])
        key = (layer, matrix.statistic.key if matrix else None, tuple(steps), tuple(values), self.size,
               self.app.theme)
        if key == self._drawn:
            return
        self._drawn = key
        plt = self.plt
        plt.clear_data()
        label = matrix.statistic.label if matrix is not None else ""
        logarithmic = matrix is not None and matrix.statistic.logarithmic
        points = [(s, v) for s, v in zip(steps, values, strict=True)
                  if math.isfinite(v) and (v > 0 or not logarithmic)]
        if points:
            xs = [s for s, _ in points]
            ys = [math.log10(v) if logarithmic else v for _, v in points]
            set_y_axis(plt, min(ys), max(ys), logarithmic=logarithmic, height=self.size.height)
            plt.plot(xs, ys, marker="braille", color=theme_rgb(self, "primary"))
        plt.xlabel("step")
        left_out = len(values) - len(points)
        note = f" ({left_out} not finite or zero: not plotted)" if left_out else ""
        self.border_title = (f"{layer}: {label}, last {number(values[-1])}{note}" if values
                             else f"{layer or 'no layer'}: no samples")
        self.refresh()
