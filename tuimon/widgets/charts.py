"""The metric chart: one plotext plot, a tab per metric, events marked as vertical lines.

Only the selected metric is drawn (a hidden chart costs nothing) and only when its series or the
events changed. Long series are reduced to a min/max envelope per column before plotting, so a
one-step loss spike survives the reduction and a 100k-point series plots as fast as a short one.
"""

from __future__ import annotations

import math

from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Tab, Tabs
from textual_plotext import PlotextPlot

from tuimon.store import THROUGHPUT_METRICS, EventRecord
from tuimon.widgets.text import number

#: Metrics shown first, in this order; others follow in the order they appeared.
PREFERRED_METRICS = ("loss", "lr", "grad_norm", *THROUGHPUT_METRICS, "step_time", "data_time")
_EVENT_COLORS = {"critical": "red", "warning": "orange", "info": "blue"}


def order_metrics(names: list[str]) -> list[str]:
    preferred = [name for name in PREFERRED_METRICS if name in names]
    return preferred + [name for name in names if name not in preferred]


def envelope(steps: list[int], values: list[float], columns: int) -> tuple[list[int], list[float]]:
    """At most ``2 * columns`` points keeping each column's minimum and maximum (NaN/Inf dropped:
    they are shown as event markers, not as points)."""
    points = [(s, v) for s, v in zip(steps, values, strict=True) if math.isfinite(v)]
    if len(points) <= 2 * columns:
        return [s for s, _ in points], [v for _, v in points]
    per_column = len(points) / columns
    out_steps: list[int] = []
    out_values: list[float] = []
    for column in range(columns):
        bucket = points[int(column * per_column) : int((column + 1) * per_column)]
        if not bucket:
            continue
        low = min(bucket, key=lambda p: p[1])
        high = max(bucket, key=lambda p: p[1])
        for step, value in sorted({low, high}):
            out_steps.append(step)
            out_values.append(value)
    return out_steps, out_values


class MetricChart(Vertical):
    """Tabs of metric names over one plot of the selected metric."""

    DEFAULT_CSS = """
    MetricChart {
        border: round $primary 50%;
        border-title-color: $primary;
        border-title-style: bold;
        height: 1fr;
    }
    MetricChart > Tabs {
        height: 2;
    }
    MetricChart Tabs Tab {
        padding: 0 1;
    }
    MetricChart > PlotextPlot {
        height: 1fr;
    }
    """

    metric: reactive[str] = reactive("loss")

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._names: list[str] = []
        self._drawn: tuple[object, ...] | None = None

    def compose(self):
        tabs = Tabs()
        tabs.can_focus = False  # keys l/g/s/c switch metrics; focus stays on the event log
        yield tabs
        yield PlotextPlot()

    def on_mount(self) -> None:
        self.border_title = "Metrics"

    @property
    def names(self) -> list[str]:
        return list(self._names)

    def set_names(self, names: list[str]) -> None:
        """Add a tab for each newly seen metric (tabs are never removed while a run is shown)."""
        ordered = order_metrics(names)
        if ordered == self._names:
            return
        tabs = self.query_one(Tabs)
        active = self.metric
        tabs.clear()
        for index, name in enumerate(ordered):
            tabs.add_tab(Tab(name, id=f"metric-{index}"))
        self._names = ordered
        if active in ordered:
            tabs.active = f"metric-{ordered.index(active)}"

    def reset(self) -> None:
        self._names = []
        self._drawn = None
        self.query_one(Tabs).clear()

    def on_tabs_tab_activated(self, event: Tabs.TabActivated) -> None:
        event.stop()
        if event.tab is not None and event.tab.id:
            index = int(event.tab.id.removeprefix("metric-"))
            if index < len(self._names):
                self.metric = self._names[index]

    def watch_metric(self, metric: str) -> None:
        if metric in self._names:
            self.query_one(Tabs).active = f"metric-{self._names.index(metric)}"
        self._drawn = None

    def show(self, steps: list[int], values: list[float], events: list[EventRecord], version: object) -> None:
        """Redraw if anything drawn changed (``version`` identifies the data shown)."""
        key = (self.metric, version, self.size)
        if key == self._drawn:
            return
        self._drawn = key
        plot = self.query_one(PlotextPlot)
        plt = plot.plt
        plt.clear_data()
        width = max(plot.size.width - 12, 10)
        xs, ys = envelope(steps, values, width)
        latest = next((v for v in reversed(values)), None)
        plt.title(f"{self.metric}  last {number(latest)}" if values else f"{self.metric}: no data yet")
        if xs:
            # A loss spike 100x the usual level would flatten everything else on a linear axis.
            logarithmic = self.metric == "lr" or (min(ys) > 0 and max(ys) / min(ys) > 30)
            if logarithmic:
                # The log is taken here, with tick labels in real units: plotext's own log scale
                # takes the log again each time the widget re-renders (theme change, resize).
                ys = [math.log10(y) for y in ys]
            low, high = min(ys), max(ys)
            ticks = [low + (high - low) * i / 4 for i in range(5)] if high > low else [low]
            plt.yticks(ticks, [number(10**tick if logarithmic else tick, 3) for tick in ticks])
            plt.plot(xs, ys, marker="braille")
            first, last = steps[0], steps[-1]
            for event in events:
                if event.step is not None and first <= event.step <= last:
                    plt.vline(event.step, _EVENT_COLORS.get(event.severity, "blue"))
        plt.xlabel("step")
        plot.refresh()
