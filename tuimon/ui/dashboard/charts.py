"""The metric chart: one plotext plot, a tab per metric, events marked as vertical lines.

Only the selected metric is drawn (a hidden chart costs nothing) and only when its series or the
events changed. Long series are reduced to a min/max envelope per column before plotting, so a
one-step loss spike survives the reduction and a 100k-point series plots as fast as a short one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from textual.app import ComposeResult
from textual.color import Color
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Tab, Tabs
from textual_plotext import PlotextPlot

from tuimon.compare.band import Band
from tuimon.store import THROUGHPUT_METRICS, EventRecord
from tuimon.ui.format import number
from tuimon.ui.job.band import band_columns
from tuimon.ui.plot import envelope, set_y_axis, theme_rgb, wide_range

#: Tabs shown at most (a tab strip of hundreds is unreadable, and each tab costs the screen).
MAX_TABS = 24
#: Metrics shown first, in this order; others follow in the order they appeared.
PREFERRED_METRICS = ("loss", "lr", "grad_norm", *THROUGHPUT_METRICS, "step_time", "data_time")
#: The unit of each standard metric (docs/protocol.md, ``metrics``), said in the chart's title; the
#: loss, the learning rate and the norms have none.
METRIC_UNITS = {
    "step_time": "s", "data_time": "s", "compute_time": "s",
    "samples_per_s": "samples/s", "tokens_per_s": "tokens/s",
    "host_mem_bytes": "bytes", "cuda_mem_allocated": "bytes", "cuda_mem_reserved": "bytes",
    "cuda_mem_peak": "bytes", "cpu_wait": "share of the time",
}
#: Theme variable for an event marker of each severity (the theme decides the actual colours,
#: so the high-contrast theme's markers differ in brightness too).
_EVENT_COLORS = {"critical": "error", "warning": "warning", "info": "secondary"}


def _band_rgb(widget: MetricChart) -> tuple[int, int, int]:
    """A baseline's band: the accent faded into the background, so the run's line reads over it."""
    variables = widget.app.theme_variables
    return Color.parse(variables["surface"]).blend(Color.parse(variables["accent"]), 0.3).rgb


def order_metrics(names: list[str]) -> list[str]:
    preferred = [name for name in PREFERRED_METRICS if name in names]
    return preferred + [name for name in names if name not in preferred]



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
        self._tab_ids: dict[str, str] = {}  # tab id -> metric name
        self._tab_serial = 0  # tab ids are never reused: removal of old tabs finishes later
        self._drawn: tuple[object, ...] | None = None

    def compose(self) -> ComposeResult:
        tabs = Tabs()
        tabs.can_focus = False  # keys l/g/s/c switch metrics; focus stays on the event log
        yield tabs
        yield PlotextPlot()

    def on_mount(self) -> None:
        self.border_title = "Metrics"

    @property
    def names(self) -> list[str]:
        return list(self._names)

    @property
    def drawn_version(self) -> object:
        """The data version of what the plot shows now (the ``version`` given to :meth:`show`),
        None before the first drawing: tells when the chart has caught up with the store."""
        return self._drawn[1] if self._drawn is not None else None

    def set_names(self, names: list[str], *, left_out: int = 0) -> None:
        """Tabs for the first :data:`MAX_TABS` metrics (standard ones first), updated in place;
        the others are charted with ``c`` and listed in the command palette, and the border says
        how many there are, with ``left_out`` names the viewer did not keep at all."""
        ordered = order_metrics(names)
        beyond = max(0, len(ordered) - MAX_TABS)
        notes = []
        if beyond:
            notes.append(f"+{beyond:,} more: c")
        if left_out:
            notes.append(f"{left_out:,} not kept")
        self.border_title = "Metrics  " + ", ".join(notes) if notes else "Metrics"
        if ordered == self._names:
            return
        self._names = ordered
        shown = ordered[:MAX_TABS]
        tabs = self.query_one(Tabs)
        tab_of = {name: tab_id for tab_id, name in self._tab_ids.items()}
        for name in [name for name in tab_of if name not in shown]:  # pushed out, or a reset
            tabs.remove_tab(tab_of.pop(name))
        for position, name in enumerate(shown):
            if name in tab_of:
                continue
            self._tab_serial += 1
            tab_id = f"metric-{self._tab_serial}"
            following = next((tab_of[later] for later in shown[position + 1:] if later in tab_of), None)
            tabs.add_tab(Tab(name, id=tab_id), before=following)
            tab_of[name] = tab_id
        self._tab_ids = {tab_id: name for name, tab_id in tab_of.items()}
        self._activate_tab()

    def _activate_tab(self) -> None:
        for tab_id, name in self._tab_ids.items():
            if name == self.metric:
                self.query_one(Tabs).active = tab_id

    def reset(self) -> None:
        self.set_names([])
        self._drawn = None

    def on_tabs_tab_activated(self, event: Tabs.TabActivated) -> None:
        event.stop()
        name = self._tab_ids.get(event.tab.id or "") if event.tab is not None else None
        if name is not None:
            self.metric = name

    def watch_metric(self) -> None:
        self._activate_tab()
        self._drawn = None

    def show(
        self,
        steps: Sequence[int],
        values: Sequence[float],
        events: list[EventRecord],
        version: object,
        *,
        rank: int | None = None,
        baseline: Band | None = None,
    ) -> None:
        """Redraw if anything drawn changed (``version`` identifies the data shown; ``rank`` names
        the rank the series is of, when the user chose one rather than the run's lowest;
        ``baseline``, a baseline's band over the same steps, is drawn behind the series: its
        edges as a shaded area, its running median as a line)."""
        key = (self.metric, version, rank, self.size, self.app.theme, baseline is not None)
        if key == self._drawn:
            return
        self._drawn = key
        plot = self.query_one(PlotextPlot)
        plt = plot.plt
        plt.clear_data()
        width = max(plot.size.width - 12, 10)
        xs, ys = envelope(steps, values, width)
        unit = METRIC_UNITS.get(self.metric)
        name = self.metric if rank is None else f"{self.metric} of rank {rank}"
        name += f" ({unit})" if unit else ""
        title = f"{name}  last {number(values[-1])}" if values else f"{name}: no data yet"
        if xs:
            spans = band_columns(baseline.steps, baseline.low, baseline.high, width) if baseline else []
            center_xs, center = envelope(baseline.steps, baseline.center, width) if baseline else ([], [])
            shown = ys + [lo for _, lo, _ in spans] + [hi for _, _, hi in spans] + center
            logarithmic = self.metric == "lr" or wide_range(ys)
            scale = math.log10 if logarithmic else float
            if logarithmic:  # a band edge at or below 0 has no place on a log axis: it stops lower down
                shown = [y for y in shown if y > 0]
                spans = [(x, lo if lo > 0 else min(shown), hi) for x, lo, hi in spans if hi > 0]
                ys = [math.log10(y) for y in ys]
            height = plot.size.height
            set_y_axis(plt, scale(min(shown)), scale(max(shown)), logarithmic=logarithmic, height=height)
            if baseline is not None:
                for x, lo, hi in spans:  # plotext fills down to a level, not between two curves
                    plt.plot([x, x], [scale(lo), scale(hi)], marker="█", color=_band_rgb(self))
                center_ys = [scale(y) for y in center]
                plt.plot(center_xs, center_ys, marker="braille", color=theme_rgb(self, "accent"))
                title += f"   {baseline.label} {number(baseline.center[-1])} (band)"
            plt.plot(xs, ys, marker="braille", color=theme_rgb(self, "primary"))
            first, last = steps[0], steps[-1]
            marked = [(e.step, e.severity) for e in events if e.step is not None and first <= e.step <= last]
            for step, severity in marked:
                plt.vline(step, theme_rgb(self, _EVENT_COLORS.get(severity, "secondary")))
            if marked:
                title += f"   │ = event ({len(marked)})"
        plt.title(title)
        plt.xlabel("step")
        plot.refresh()
