"""The loss across ranks: the median as a line over the band from the lowest to the highest rank.

A band that widens while the median holds is ranks drifting apart (a replica diverging, one
rank's data going bad) before the median shows it. Drawn with the helpers every chart shares
(:mod:`tuimon.ui.plot`): a min/max envelope per column, a log axis when a spike would
flatten the rest. The band is a filled area and the median a line, so it reads by shape, not
only colour.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from textual.color import Color
from textual_plotext import PlotextPlot

from tuimon.ui.format import number
from tuimon.ui.plot import envelope, set_y_axis, theme_rgb, wide_range

#: (steps, low, median, high), as :attr:`tuimon.store.JobView.band`.
Band = tuple[Sequence[int], Sequence[float], Sequence[float], Sequence[float]]


def band_columns(
    steps: Sequence[int], low: Sequence[float], high: Sequence[float], columns: int
) -> list[tuple[float, float, float]]:
    """(x, lowest, highest) for each of ``columns`` slices of the steps: the extremes of the points
    in the slice and of the band interpolated at its edges, so that neither a one-step excursion
    (many points a column) nor a gap between sparse points (few) is lost. Non-finite values are
    left out (a NaN loss is an event of its own)."""
    kept = [(s, lo, hi) for s, lo, hi in zip(steps, low, high, strict=False) if math.isfinite(lo + hi)]
    if not kept:
        return []
    xs = [s for s, _, _ in kept]
    first, last = xs[0], xs[-1]
    if first == last:
        return [(first, min(lo for _, lo, _ in kept), max(hi for _, _, hi in kept))]

    def at(x: float) -> tuple[float, float]:
        right = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
        (x0, lo0, hi0), (x1, lo1, hi1) = kept[right - 1], kept[right]
        share = (x - x0) / (x1 - x0) if x1 != x0 else 0.0
        return lo0 + (lo1 - lo0) * share, hi0 + (hi1 - hi0) * share

    out = []
    for column in range(columns):
        start, stop = (first + (last - first) * edge / columns for edge in (column, column + 1))
        inside = kept[bisect.bisect_left(xs, start):bisect.bisect_right(xs, stop)]
        edges = [at(start), at(stop)]
        lows = [lo for _, lo, _ in inside] + [lo for lo, _ in edges]
        highs = [hi for _, _, hi in inside] + [hi for _, hi in edges]
        out.append(((start + stop) / 2, min(lows), max(highs)))
    return out


class LossBand(PlotextPlot):
    DEFAULT_CSS = """
    LossBand {
        border: round $primary 50%;
        border-title-color: $primary;
        border-title-style: bold;
        height: 1fr;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._drawn: object = None

    def on_mount(self) -> None:
        self.border_title = "Loss across ranks"

    def show(self, band: Band) -> None:
        """Redraw if the band grew, or the size or theme changed."""
        steps, low, median, high = band
        key = (len(steps), steps[-1] if steps else None, self.size, self.app.theme)
        if key == self._drawn:
            return
        self._drawn = key
        plt = self.plt
        plt.clear_data()
        # More columns than the plot has: every character column gets a slice of its own.
        columns = max(self.size.width, 10)
        spans = band_columns(steps, low, high, columns)
        median_xs, median_ys = envelope(steps, median, columns)
        if spans and median_ys:
            values = [lo for _, lo, _ in spans] + [hi for _, _, hi in spans] + median_ys
            logarithmic = wide_range(values)
            scale = math.log10 if logarithmic else float
            set_y_axis(
                plt, scale(min(values)), scale(max(values)), logarithmic=logarithmic, height=self.size.height
            )
            band_colour = Color.parse(self.app.theme_variables["surface"]).blend(
                Color.parse(self.app.theme_variables["primary"]), 0.45
            ).rgb
            for x, lo, hi in spans:  # plotext fills down to a level, not between two curves
                plt.plot([x, x], [scale(lo), scale(hi)], marker="█", color=band_colour)
            median_line = [scale(y) for y in median_ys]
            plt.plot(median_xs, median_line, marker="braille", color=theme_rgb(self, "primary"))
        self.border_title = _title(low, median, high)
        self.refresh()


def _title(low: Sequence[float], median: Sequence[float], high: Sequence[float]) -> str:
    if not median:
        return "Loss across ranks: no summaries yet"
    return (
        f"Loss across ranks: median {number(median[-1])} (line), lowest to highest rank "
        f"{number(low[-1])} to {number(high[-1])} (band)"
    )
