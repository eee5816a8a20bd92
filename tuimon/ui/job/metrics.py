"""The figures the job grid colours its cells by: what each means, its scale, which end is bad.

A grid of thousands of GPUs is read for the odd one out, as Megatron-LM's straggler detector
(``megatron/core/utils.py``, ``StragglerDetector``) reports the min and max across ranks of
elapsed time, GPU utilisation, temperature, power and clocks with the ranks holding them. So each
figure is put on a scale where the healthy majority looks alike and the outlier stands out:

- utilisation, memory share and temperature have fixed physical scales (a steady 97-99 %
  must not look like wild swings, as it would on a scale stretched to the data's own min and max);
- step time, data wait and compute time have none, so they are scaled against the job itself:
  step time from 0 to twice the job's median (the median sits mid-scale, a rank twice as slow is
  at the top), data wait and compute time from 0 to the job's median step time (a rank that
  waits a whole step for its batch is as bad as it gets). NVIDIA Resiliency Extension's
  straggler detection scores ranks the same way, relative to the others rather than in absolute
  seconds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tuimon.store import CELL_METRICS, Cell
from tuimon.ui.format import number
from tuimon.ui.levels import LEVELS


def _percent(value: float) -> str:
    return f"{value:.0f} %"


def _share(value: float) -> str:
    return f"{100 * value:.0f} %"


def _celsius(value: float) -> str:
    return f"{value:.0f} °C"


def _seconds(value: float) -> str:
    return f"{number(value * 1000, 3)} ms" if value < 1 else f"{number(value, 3)} s"


def _median_of(cells: Iterable[Cell], key: str) -> float | None:
    values = [v for cell in cells if math.isfinite(v := cell.values.get(key, math.nan))]
    return statistics.median(values) if values else None


def _step_scale(cells: list[Cell]) -> tuple[float, float]:
    median = _median_of(cells, "step_time")
    return 0.0, 2 * median if median else 1.0


def _part_of_step(key: str) -> Callable[[list[Cell]], tuple[float, float]]:
    """The scale of a part of the step (data wait, compute): 0 to the job's median step time, or
    to the largest value where step times are unknown."""

    def scale(cells: list[Cell]) -> tuple[float, float]:
        median_step = _median_of(cells, "step_time")
        if median_step:
            return 0.0, median_step
        values = [v for cell in cells if math.isfinite(v := cell.values.get(key, math.nan))]
        return 0.0, max(values, default=0.0) or 1.0

    return scale


@dataclass(frozen=True)
class GridMetric:
    """One figure of :data:`tuimon.store.job.CELL_METRICS`: ``key`` in ``Cell.values``."""

    key: str
    title: str
    #: Whether a high value is the bad end (utilisation: a low one is).
    high_is_bad: bool
    #: The scale's (low, high) for the cells shown.
    scale: Callable[[list[Cell]], tuple[float, float]]
    text: Callable[[float], str]
    #: How the scale is chosen, for the legend.
    scale_note: str = ""

    def value(self, cell: Cell) -> float | None:
        value = cell.values.get(self.key)
        return value if value is not None and math.isfinite(value) else None

    def level(self, value: float, scale: tuple[float, float]) -> int:
        """0 (the scale's low end) to ``LEVELS - 1`` (its high end)."""
        low, high = scale
        fraction = (value - low) / (high - low) if high > low else 0.0
        return min(max(int(fraction * LEVELS), 0), LEVELS - 1)

    def badness(self, level: int) -> float:
        """0 (healthy) to 1 (the bad end), whichever end of the scale that is."""
        share = level / (LEVELS - 1)
        return share if self.high_is_bad else 1.0 - share

    def worst(self, values: list[float]) -> float:
        """The value a group of cells (a node) is shown with: its worst."""
        return max(values) if self.high_is_bad else min(values)


GRID_METRICS: dict[str, GridMetric] = {
    metric.key: metric
    for metric in (
        GridMetric("util", "GPU utilisation", False, lambda _: (0.0, 100.0), _percent),
        GridMetric("mem", "GPU memory used", True, lambda _: (0.0, 1.0), _share),
        GridMetric("temp_c", "GPU temperature", True, lambda _: (20.0, 100.0), _celsius),
        GridMetric("step_time", "step time", True, _step_scale, _seconds, "0 to 2x the job's median"),
        GridMetric("data_time", "data wait", True, _part_of_step("data_time"), _seconds,
                   "0 to the job's median step"),
        GridMetric("compute_time", "compute time", True, _part_of_step("compute_time"), _seconds,
                   "0 to the job's median step"),
    )
}
assert tuple(GRID_METRICS) == CELL_METRICS, "the grid offers the store's cell figures, in order"


def next_metric(key: str) -> str:
    order = list(GRID_METRICS)
    return order[(order.index(key) + 1) % len(order)] if key in order else order[0]
