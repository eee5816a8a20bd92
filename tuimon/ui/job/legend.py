"""The job grid's legend: the figure shown, its scale, where its extremes are, the marks.

Parts are laid out in order of importance on as many lines as the grid leaves free (one at
least), each part on the first line it fits; a part that fits nowhere is left out, so a narrow
terminal keeps the figure and its scale and drops the key to the marks first.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from textual.content import Content

from tuimon.store import Cell
from tuimon.ui.job.layout import GridLayout
from tuimon.ui.job.metrics import LEVELS, GridMetric
from tuimon.ui.job.palette import Palette
from tuimon.ui.job.problems import PROBLEM_LOOK
from tuimon.ui.levels import NO_DATA, NO_DATA_STYLE

_DIM = "$foreground 70%"
_SEPARATOR = Content.styled("  │  ", "$foreground 40%")


def scale_swatch(metric: GridMetric, scale: tuple[float, float], palette: Palette) -> Content:
    """``0 % ▁▂▃▄▅▆▇█ 100 %``: every level in its colour (and shape), the scale's ends in words."""
    low, high = scale
    levels = [(palette.glyph(level), palette.style(metric, level)) for level in range(LEVELS)]
    return Content.assemble(f"{metric.text(low)} ", *levels, f" {metric.text(high)}")


def spread(metric: GridMetric, cells: Iterable[Cell]) -> Content | None:
    """Lowest, median and highest value with the ranks holding the extremes (None: no values)."""
    valued = [(value, cell.rank) for cell in cells if (value := metric.value(cell)) is not None]
    if not valued:
        return None
    low, high = min(valued), max(valued)
    median = statistics.median(value for value, _ in valued)
    return Content.assemble(
        ("min ", _DIM), (metric.text(low[0]), "bold"), (f" r{low[1]}", _DIM),
        ("  median ", _DIM), (metric.text(median), "bold"),
        ("  max ", _DIM), (metric.text(high[0]), "bold"), (f" r{high[1]}", _DIM),
    )


def marks_key() -> Content:
    parts = [Content.styled(label, style) for _, label, style in PROBLEM_LOOK.values()]
    parts.append(Content.assemble((NO_DATA, NO_DATA_STYLE), (" no data", _DIM)))
    return Content(" ").join(parts)


def arrangement(layout: GridLayout, shown: tuple[int, int]) -> str:
    what = "1 cell = 1 node (its worst GPU)" if layout.mode == "nodes" else "1 cell = 1 GPU"
    first, last = shown
    if layout.rows > last - first:
        what += f", rows {first + 1}-{last} of {layout.rows}"
    return what


def legend(
    metric: GridMetric,
    scale: tuple[float, float],
    palette: Palette,
    cells: list[Cell],
    layout: GridLayout,
    shown: tuple[int, int],
    width: int,
    lines: int = 1,
) -> list[Content]:
    """At most ``lines`` lines of ``width`` columns; ``shown`` is the (first, end) of the rows on screen."""
    note = f" ({metric.scale_note})" if metric.scale_note else ""
    title = Content.assemble((metric.title, "bold"), (note, _DIM))
    parts = [
        Content(" ").join([title, scale_swatch(metric, scale, palette)]),
        spread(metric, cells),
        Content.styled(arrangement(layout, shown), _DIM),
        marks_key(),
        Content.styled("m: next figure", _DIM),
    ]
    laid: list[Content] = []
    for part in parts:
        if part is None:
            continue
        for number, line in enumerate(laid):
            longer = line + _SEPARATOR + part
            if longer.cell_length <= width:
                laid[number] = longer
                break
        else:
            if len(laid) < lines and part.cell_length <= width:
                laid.append(part)
    return laid
