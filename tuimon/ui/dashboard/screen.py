"""The dashboard: one run's header, GPUs, metric chart, invariants and events, with its keys.

The source fills a :class:`~tuimon.store.Store` on its own thread; this screen only reads it, on
two timers of its own: numbers a few times a second, charts about once a second. Each panel is
redrawn only when the store's version counter for what it shows moved (and charts only while the
dashboard is the screen on top), so a fast run costs the terminal, and the SSH link, no more than
a slow one.

Its keys are bindings of this screen, so Textual offers them only while it has the input; a
recording's (pause, speed, seek) come with :class:`~tuimon.ui.dashboard.replay.ReplayDashboard`.
The screens it opens get what they need as arguments: the incident screen and the event details
the selected event in its context (:meth:`DashboardScreen.event_context`), the layer panel and
the job view the store and the run.

When the source is a relay (the run has node summaries), the job view (:mod:`tuimon.ui.job`) opens
once by itself and on ``j``; picking a rank there brings the dashboard back *focused* on it: its
charts show that rank's series, and a live source is asked for that rank's full stream.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from functools import partial
from typing import ClassVar

from textual import events
from textual.app import ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.css.query import NoMatches
from textual.geometry import Size
from textual.screen import Screen
from textual.widgets import DataTable, Tab, Tabs

from tuimon.compare.band import Baseline
from tuimon.sources.base import RankFocus, Source
from tuimon.store import THROUGHPUT_METRICS, EventRecord
from tuimon.store.layers import named_layers, statistic_for
from tuimon.ui.compact import COMPACT, mark_compact
from tuimon.ui.context import EventContext
from tuimon.ui.dashboard.charts import MetricChart
from tuimon.ui.dashboard.events import EventLog
from tuimon.ui.dashboard.gpu import GpuPanel
from tuimon.ui.dashboard.header import RunHeader
from tuimon.ui.dashboard.invariants import InvariantTable
from tuimon.ui.dashboard.status import StatusLine
from tuimon.ui.event_detail import CONTEXT_STEPS, EventDetailScreen
from tuimon.ui.footer import FittedFooter
from tuimon.ui.help import Section, binding_entries
from tuimon.ui.incidents.screen import IncidentScreen
from tuimon.ui.job.grid import GridState
from tuimon.ui.job.screen import JobScreen
from tuimon.ui.keys import HELP, QUIT, THEME
from tuimon.ui.layers.screen import LayerScreen
from tuimon.ui.palette import ScreenCommands
from tuimon.ui.services.kb_link import KbLink
from tuimon.ui.table import TablePanel

#: The smallest terminal (columns, rows) that shows the four panels at once; below it the dashboard
#: shows one at a time, with a tab bar (GPU cards need 64 columns, the chart and tables ~50 more;
#: the GPU and chart row needs 24 rows, the tables ~10).
WIDE_LAYOUT = (116, 38)
#: The compact layout's views, in tab order, and the panel each shows.
VIEWS = {"chart": "Charts", "gpus": "GPUs", "invariants": "Invariants", "events": "Events"}
_VIEW_PANELS = {"chart": "chart", "gpus": "gpus", "invariants": "invariants-panel", "events": "events-panel"}
#: Redraw rates (Hz): numbers and tables; charts (a plotext redraw costs far more).
NUMBERS_HZ = 4.0
CHARTS_HZ = 1.25


class DashboardScreen(Screen[None]):
    """The dashboard over ``source``; ``run`` preselects a run; ``kb_link`` is the app's link to the
    incident knowledge base ("seen before" offers for new events, the incident screen);
    ``baseline`` (``--baseline``) is drawn beside the chart of each metric it has."""

    DEFAULT_CSS = """
    DashboardScreen #top {
        height: 24;
    }
    DashboardScreen #bottom {
        height: 1fr;
    }
    DashboardScreen #gpus {
        width: 64;
    }
    DashboardScreen #invariants-panel {
        width: 72;
    }
    DashboardScreen #views {
        display: none;
        height: 1;
    }
    DashboardScreen.-compact #views {
        display: block;
    }
    DashboardScreen.-compact #top, DashboardScreen.-compact #bottom {
        height: 1fr;
    }
    DashboardScreen.-compact #gpus, DashboardScreen.-compact #invariants-panel {
        width: 1fr;
    }
    """
    # The app's keys (tuimon.ui.keys) are listed here too, only to place them in this footer, which
    # shows as many as fit, in this order (tuimon.ui.footer): quit and help first, then from an event
    # to what is done about it, then the charts.
    BINDINGS: ClassVar[list[BindingType]] = [
        QUIT,
        HELP,
        Binding("v", "next_view", "View",
                tooltip="Next panel on a small terminal: chart, GPUs, invariants, events"),
        Binding("e", "focus_events", "Events", tooltip="Focus the event log (up/down to select)"),
        Binding("enter", "event_details", "Details", show=False, tooltip="Details of the selected event"),
        Binding("i", "incidents", "Incidents", tooltip="Incident knowledge base for the selected event"),
        Binding("o", "open_incident", "New incident", tooltip="Open an incident from the selected event"),
        Binding("h", "layers", "Layers",
                tooltip="Layer heatmap: each layer's gradients, updates, activations over time"),
        Binding("j", "job", "Job", tooltip="The job view: every GPU of every node (the source is a relay)"),
        Binding("r", "next_run", "Run", tooltip="Show the next run (when several are watched)"),
        Binding("l", "chart('loss')", "Loss", tooltip="Chart the loss"),
        Binding("g", "chart('grad_norm')", "Grad", tooltip="Chart the gradient norm"),
        Binding("s", "chart('throughput')", "Speed", tooltip="Chart the throughput (tokens/s or samples/s)"),
        Binding("c", "next_chart", "Chart", tooltip="Chart the next metric (lr, step time, ...)"),
        THEME,
        Binding("escape", "all_ranks", "All ranks", tooltip="Charts of the lowest rank, not the one picked"),
    ]
    COMMANDS = {ScreenCommands}  # noqa: RUF012 (Textual declares it a set)

    def __init__(
        self, source: Source, kb_link: KbLink, *, run: str | None = None, baseline: Baseline | None = None
    ) -> None:
        super().__init__()
        self.source = source
        self.baseline = baseline
        self.store = source.store
        self.kb_link = kb_link
        self.run_name: str | None = None
        self._wanted_run = run
        self._seen: dict[str, object] = {}
        self._generation = self.store.generation
        #: The rank picked in the job view, whose series the charts show (None: the lowest rank).
        self.focus_rank: int | None = None
        self._job_state = GridState()
        self._job_opened: set[str] = set()  # runs whose job view was opened (once by itself)
        self._runs_heard: set[str] = set()
        #: Runs that started while another was shown, announced and not yet looked at (newest last):
        #: ``r`` goes to the newest first.
        self._new_runs: list[str] = []
        #: The panel shown in the compact layout (:data:`VIEWS`).
        self.view = "chart"

    # ------------------------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield RunHeader(id="header")
        views = Tabs(*(Tab(label, id=f"view-{name}") for name, label in VIEWS.items()), id="views")
        views.can_focus = False  # its left/right would take the replay's seek keys
        yield views
        with Horizontal(id="top"):
            yield GpuPanel(id="gpus")
            yield MetricChart(id="chart")
        with Horizontal(id="bottom"):
            yield TablePanel(InvariantTable(id="invariants"), id="invariants-panel")
            yield TablePanel(EventLog(id="events"), id="events-panel")
        yield StatusLine(id="status")
        yield FittedFooter()

    def on_mount(self) -> None:
        self._lay_out(self.app.size)
        self.query_one(EventLog).focus()
        self.refresh_numbers()
        self.set_interval(1 / NUMBERS_HZ, self.refresh_numbers)
        self.set_interval(1 / CHARTS_HZ, self.refresh_chart)

    # ---------------------------------------------------------------------- small terminals

    @property
    def compact(self) -> bool:
        """True on a terminal too small for the four panels side by side (80x24 is the classic)."""
        return self.has_class(COMPACT)

    def on_resize(self, event: events.Resize) -> None:
        self._lay_out(event.size)

    def on_screen_resume(self) -> None:
        self._lay_out(self.app.size)  # the terminal may have changed while a screen covered this one

    def _lay_out(self, size: Size) -> None:
        """Wide: the four panels at once. Compact: one panel at a time, the whole screen's, chosen
        on the tab bar (``v``, a click, or the key of what it shows: l/g/s/c, e)."""
        if mark_compact(self, size, WIDE_LAYOUT):
            self.refresh_bindings()  # the footer offers v only in the compact layout
        compact = self.compact
        shown = {name: not compact or name == self.view for name in VIEWS}
        for name, panel_id in _VIEW_PANELS.items():
            self.query_one(f"#{panel_id}").display = shown[name]
        self.query_one("#top").display = shown["chart"] or shown["gpus"]
        self.query_one("#bottom").display = shown["invariants"] or shown["events"]
        if compact:
            self.query_one("#views", Tabs).active = f"view-{self.view}"

    def show_view(self, name: str) -> None:
        """Bring ``name``'s panel forward (compact layout; in the wide one every panel is shown)."""
        self.view = name
        if not self.compact:
            return
        self._lay_out(self.app.size)
        table = {"events": EventLog, "invariants": InvariantTable}.get(name)
        if table is not None:
            self.query_one(table).focus()
        else:
            self.set_focus(None)  # a hidden table's cursor would move unseen

    def on_tabs_tab_activated(self, event: Tabs.TabActivated) -> None:
        if event.tabs.id == "views" and event.tab.id is not None:
            name = event.tab.id.removeprefix("view-")
            if name != self.view:
                self.show_view(name)

    def action_next_view(self) -> None:
        names = list(VIEWS)
        self.show_view(names[(names.index(self.view) + 1) % len(names)])

    # ----------------------------------------------------------------------------------- redraws

    def _changed(self, key: str, version: object) -> bool:
        """True (and remembered) when ``version`` differs from what ``key`` last drew."""
        if self._seen.get(key) == version:
            return False
        self._seen[key] = version
        return True

    def _select_run(self, name: str | None) -> None:
        if name != self.run_name:
            self.focus_rank = None  # the rank picked was one of the other run's
        self.run_name = name
        self._seen.clear()
        self.query_one(GpuPanel).reset()
        self.query_one(MetricChart).reset()
        self.query_one(InvariantTable).reset()
        self.query_one(EventLog).reset()

    def has_job(self) -> bool:
        """Whether node relays summarised the current run: the job view has something to show."""
        return self.run_name is not None and self.store.versions(self.run_name)["nodes"] != 0

    def refresh_numbers(self) -> None:
        """Header, GPUs, tables and status line, each only if what it shows changed."""
        with contextlib.suppress(NoMatches):  # a tick that fires while the app is torn down, its widgets gone
            self._refresh_numbers()

    def _refresh_numbers(self) -> None:
        store = self.store
        if store.generation != self._generation:
            self._generation = store.generation
            if self.run_name is not None:
                self._select_run(self.run_name)  # the store was rebuilt (a replay seeked backwards)
        if self.run_name is None:
            names = store.run_names()
            if names:
                preferred = self._wanted_run if self._wanted_run in names else names[0]
                self._select_run(preferred)
        run = self.run_name
        if run is not None:
            self._announce_new_runs(store.run_names(), run)
        view = store.run_view(run) if run else None
        versions = store.versions(run) if run else {}
        source, notices, now = store.source_status(), store.notices(), store.now()
        width = self.size.width  # the header and the status line fit their fields to it
        if self._changed("header", (view, source, tuple(notices), int(now), self.focus_rank, width)):
            self.query_one(RunHeader).show(view, source, notices, now, focus=self.focus_rank, width=width)
        if self._changed("status", (store.status_version(), width)):
            self.query_one(StatusLine).show(store.counters(), self.source.where(), width)
        if run is None:
            return
        said = (view.gpu_source, view.gpu_simulated) if view else None  # what the run said of its GPUs
        if self._changed("gpu", (versions["gpu"], self.focus_rank, said)):
            devices = store.devices(run)
            focused = [device for device in devices if device.rank == self.focus_rank]
            self.query_one(GpuPanel).show(focused or devices, view)
        if self._changed("invariants", versions["invariants"]):
            self.query_one(InvariantTable).show(store.invariants(run))
        if self._changed("events", versions["events"]):
            events = store.events(run)
            self.query_one(EventLog).show(events)
            self.kb_link.offer_seen_before(run, events)
        chart = self.query_one(MetricChart)
        if self._changed("metric-names", versions["metrics"]):
            chart.set_names(store.metric_names(run), left_out=view.metrics_left_out if view else 0)
        has_job = versions["nodes"] != 0
        if has_job and self._changed("has-job", has_job):
            self.refresh_bindings()  # the footer offers j from now on
        if has_job and run not in self._job_opened and self.is_active:
            self.action_job()  # once by itself: the job is what a relay's user came to see

    def refresh_chart(self) -> None:
        """The selected metric's chart, while the dashboard is the screen on top."""
        with contextlib.suppress(NoMatches):  # a tick that fires while the app is torn down, its widgets gone
            self._refresh_chart()

    def _refresh_chart(self) -> None:
        run = self.run_name
        if run is None or not self.is_active:
            return
        versions = self.store.versions(run)
        chart = self.query_one(MetricChart)
        steps, values = self.store.series(run, chart.metric, rank=self.focus_rank)
        version = (versions["metrics"], versions["events"])
        band = None
        if self.baseline is not None and steps:
            band = self.baseline.band(chart.metric, steps[0], steps[-1])
        chart.show(steps, values, self.store.events(run), version, rank=self.focus_rank, baseline=band)

    # ----------------------------------------------------------------------------------- actions

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if not self.is_active:
            # Covered by another screen, its keys cannot reach it: its footer, still in view around
            # a dialog, offers none of them.
            return False
        if action == "all_ranks":
            return self.focus_rank is not None
        if action == "next_view":
            return self.compact
        return True

    def _announce_new_runs(self, names: list[str], shown: str) -> None:
        """A run heard for the first time while another is shown is said at once, with the key
        that shows it: otherwise only the "received" count would change. Those heard before the
        first run was shown are not new."""
        if not self._runs_heard:
            self._runs_heard.update(names)
            return
        for name in names:
            if name in self._runs_heard:
                continue
            self._runs_heard.add(name)
            if name != shown:
                self._new_runs.append(name)
                view = self.store.run_view(name)
                where = f" on {', '.join(view.hosts)}" if view is not None and view.hosts else ""
                self.notify(f"{name}{where}: r shows it", title="A new run started", timeout=15)

    def action_next_run(self) -> None:
        names = self.store.run_names()
        if not names:
            self.notify("no runs yet", timeout=2)
            return
        fresh = [name for name in self._new_runs if name in names and name != self.run_name]
        self._new_runs = fresh[:-1]
        position = names.index(self.run_name) if self.run_name in names else -1
        following = fresh[-1] if fresh else names[(position + 1) % len(names)]
        if following == self.run_name:
            self.notify(f"only one run so far: {following}", timeout=2)
            return
        self._select_run(following)
        self.refresh_numbers()
        self.refresh_chart()
        self.notify(f"run: {following} ({names.index(following) + 1} of {len(names)})", timeout=2)

    def action_chart(self, metric: str) -> None:
        chart = self.query_one(MetricChart)
        if metric == "throughput":
            metric = next((name for name in THROUGHPUT_METRICS if name in chart.names), THROUGHPUT_METRICS[0])
        chart.metric = metric
        self.show_view("chart")
        self.refresh_chart()

    def action_next_chart(self) -> None:
        chart = self.query_one(MetricChart)
        names = chart.names
        if names:
            position = names.index(chart.metric) if chart.metric in names else -1
            chart.metric = names[(position + 1) % len(names)]
            self.show_view("chart")
            self.refresh_chart()

    def action_job(self) -> None:
        """The job view of the current run (its figure and cursor kept from the last opening)."""
        run = self.run_name
        if run is None or not self.has_job():
            self.notify("The job view needs a relay's stream: `tuimon watch` the job's root relay "
                        "(`tuimon relay --root`), whose summaries name every node and rank",
                        title="No job view here", severity="warning")
            return
        self._job_opened.add(run)
        self.app.push_screen(JobScreen(self.store, run, self._job_state), self._job_closed)

    def _job_closed(self, rank: int | None) -> None:
        if rank is not None:
            self.focus_on(rank)

    def focus_on(self, rank: int | None) -> None:
        """Show ``rank``'s own series on the dashboard (None: the run's lowest rank, as before)."""
        run = self.run_name
        if run is None or rank == self.focus_rank:
            return
        self.focus_rank = rank
        if isinstance(self.source, RankFocus):
            view = self.store.run_view(run)
            lowest = view.ranks[0] if view is not None and view.ranks else 0
            self.source.focus_rank(run, lowest if rank is None else rank)
        self.refresh_bindings()
        self.refresh_numbers()
        self.refresh_chart()
        self.notify(f"rank {rank}: its charts and GPUs (j: job view, escape: all ranks)" if rank is not None
                    else "all ranks: the charts show the lowest rank", timeout=3)

    def action_all_ranks(self) -> None:
        self.focus_on(None)

    def action_focus_events(self) -> None:
        self.show_view("events")
        log = self.query_one(EventLog)
        log.focus()
        log.hold()  # the user is about to pick an event: new ones must not move the cursor off it

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "events":
            # The row enter was pressed on: a redraw since then may have moved the cursor.
            self.show_event_details(self._run_event(event.row_key.value))

    def selected_event(self) -> EventRecord | None:
        """The event under the event log's cursor."""
        return self._run_event(self.query_one(EventLog).highlighted_key)

    def _run_event(self, event_id: str | None) -> EventRecord | None:
        if self.run_name is None or event_id is None:
            return None
        return self.store.event(self.run_name, event_id)

    def event_context(self, *, before: int = 50, after: int = 50) -> EventContext | None:
        """The selected event, its run and the metrics ``before``/``after`` its step."""
        return self._context_of(self.selected_event(), before, after)

    def _context_of(self, event: EventRecord | None, before: int, after: int) -> EventContext | None:
        if event is None or self.run_name is None:
            return None
        window = {}
        if event.step is not None:
            window = self.store.metric_window(self.run_name, event.step, before=before, after=after)
        return EventContext(self.store, self.run_name, self.store.run_view(self.run_name), event, window)

    def action_event_details(self) -> None:
        self.show_event_details(self.selected_event())

    def show_event_details(self, event: EventRecord | None) -> None:
        """The details of ``event`` (None: say how an event gets selected)."""
        context = self._context_of(event, CONTEXT_STEPS, CONTEXT_STEPS)
        if context is None:
            self.notify("no event selected: events appear in the log when detectors fire", timeout=3)
            return
        started = context.run_view.started_ts if context.run_view else None
        layers = self._layer_screen(context.event)
        detail = EventDetailScreen(context.run, context.event, context.window, started,
                                   event_layers=layers.named)

        def closed(wanted: str | None) -> None:
            if wanted == "layers":
                self.app.push_screen(layers)

        self.app.push_screen(detail, closed)

    def _layer_screen(self, event: EventRecord | None) -> LayerScreen:
        """The layer panel for the current run: on ``event``'s rank, statistic and layers when it
        is about some, else on the focused rank's gradient norms."""
        run = self.run_name or ""
        if event is None:
            return LayerScreen(self.store, run, rank=self.focus_rank)
        statistic = statistic_for(event.kind)
        matrix = self.store.layer_matrix(run, statistic, rank=event.rank)
        named = tuple(named_layers(event.details, matrix.layers)) if matrix is not None else ()
        return LayerScreen(self.store, run, rank=event.rank, statistic=statistic, named=named)

    def action_layers(self) -> None:
        """The layer panel, on the selected event's layers when it names some."""
        if self.run_name is None:
            self.notify("no run yet", timeout=2)
            return
        event = self.selected_event()
        has_rank = event is not None and event.rank is not None
        self.app.push_screen(self._layer_screen(event if has_rank else None))

    def action_incidents(self) -> None:
        """The incident knowledge base, on the selected event (:meth:`event_context`) if any."""
        self.app.push_screen(IncidentScreen(self.kb_link, self.event_context()))

    def action_open_incident(self) -> None:
        """One key press from an anomaly to an incident: open one from the selected event
        (its context captured), or a blank one when no event is selected."""
        self.app.push_screen(IncidentScreen(self.kb_link, self.event_context(), open_incident=True))

    # ----------------------------------------------------------------------------- command palette

    def palette_commands(self) -> Iterable[SystemCommand]:
        """The dashboard's commands in the palette (:mod:`tuimon.ui.palette`): every metric, not
        only those with a key, and the actions of its keys."""
        for metric in self.query_one(MetricChart).names:
            chart = partial(self.action_chart, metric)
            yield SystemCommand(f"Chart: {metric}", f"Chart the {metric} metric", chart)
        yield SystemCommand("Next run", "Show the next run heard from", self.action_next_run)
        if self.has_job():
            yield SystemCommand("Job view", "Every GPU of every node, the loss across ranks", self.action_job)
        yield SystemCommand("Event details", "Details of the selected event", self.action_event_details)


def key_section(display: Callable[[Binding], str]) -> Section:
    """The dashboard's keys, as the help screen lists them (``display``: how the app writes a
    binding's key)."""
    keys = binding_entries(DashboardScreen.BINDINGS, display)
    keys += [
        ("ctrl+p", "Command palette (themes, charts, runs, replay)"),
        ("↑ ↓", "Move in a table"),
    ]
    return "Dashboard", keys
