"""What every plotext chart of the UI shares: long series reduced to what a column can show,
readable y axes, theme colours.

The dashboard's metric chart, the job view's loss band and the layer panel's history draw with
these, so that a spike, a log axis and a colour read the same on each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from textual.color import Color
from textual.widget import Widget

from tuimon.ui.format import number


def envelope(steps: Sequence[int], values: Sequence[float], columns: int) -> tuple[list[int], list[float]]:
    """At most ``2 * columns`` points keeping each column's minimum and maximum (NaN/Inf dropped:
    they are shown as event markers, not as points).

    Buckets are slices and min/max run in C over them, so 200k points cost a few milliseconds;
    only a bucket holding a non-finite value is filtered point by point.
    """
    count = len(values)
    if count <= 2 * columns:
        kept = [i for i in range(count) if math.isfinite(values[i])]
        return [steps[i] for i in kept], [values[i] for i in kept]
    per_column = count / columns
    out_steps: list[int] = []
    out_values: list[float] = []
    for column in range(columns):
        start, stop = int(column * per_column), int((column + 1) * per_column)
        bucket = values[start:stop]
        low, high = min(bucket), max(bucket)
        if not (math.isfinite(low) and math.isfinite(high)):
            finite = [v for v in bucket if math.isfinite(v)]
            if not finite:
                continue
            low, high = min(finite), max(finite)
        for index in sorted({start + bucket.index(low), start + bucket.index(high)}):
            out_steps.append(steps[index])
            out_values.append(values[index])
    return out_steps, out_values


#: Rows of a plotext plot that hold no data: the frame's top and bottom and the x labels.
_PLOT_FRAME_ROWS = 3


def theme_rgb(widget: Widget, variable: str) -> tuple[int, int, int]:
    """A theme colour as plotext takes it (an RGB triple)."""
    return Color.parse(widget.app.theme_variables[variable]).rgb


def wide_range(values: Sequence[float]) -> bool:
    """Whether a linear axis would flatten most of ``values`` (a loss spike 100x the usual level)."""
    return min(values) > 0 and max(values) / min(values) > 30


def set_y_axis(plt: Any, low: float, high: float, *, logarithmic: bool, height: int) -> None:
    """Up to five ticks from ``low`` to ``high`` labelled in real units, at least a row and a half
    apart on a plot ``height`` rows tall: two ticks on one row leave plotext to pick which label
    shows, and its pick varies from one drawing to the next. On a logarithmic axis the values
    plotted are already log10'd by the caller: plotext's own log scale takes the log again each
    time the widget re-renders (theme change, resize)."""
    rows = height - _PLOT_FRAME_ROWS
    count = max(2, min(5, 1 + (rows - 1) * 2 // 3))
    ticks = [low + (high - low) * i / (count - 1) for i in range(count)] if high > low else [low]
    plt.yticks(ticks, [number(10**tick if logarithmic else tick, 3) for tick in ticks])
