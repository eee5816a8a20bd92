"""The dashboard driven by Textual's Pilot over real sources (recordings and live sockets)."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from helpers.keys import paste
from helpers.peers import RawPublisher
from helpers.recordings import write_recording
from helpers.runs import RunBuilder, synthetic_run
from helpers.screens import statics_text
from helpers.waiting import wait_for_screen
from rich.color import Color as RichColor
from rich.style import Style
from rich.table import Table
from textual.app import App, ComposeResult
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import Static
from textual.widgets._footer import FooterKey
from textual_plotext import PlotextPlot

from tuimon.sources.live import LiveSource
from tuimon.sources.replay import ReplaySource
from tuimon.store import EventRecord
from tuimon.ui.app import TuimonApp
from tuimon.ui.dashboard.charts import MetricChart
from tuimon.ui.dashboard.events import EventLog
from tuimon.ui.dashboard.gpu import GpuCard, GpuPanel
from tuimon.ui.dashboard.header import RunHeader
from tuimon.ui.dashboard.invariants import InvariantTable
from tuimon.ui.event_detail import EventDetailScreen
from tuimon.ui.help import HelpScreen
from tuimon.ui.incidents.screen import IncidentScreen
from tuimon.ui.layers.screen import LayerScreen
from tuimon.ui.plot import envelope
from tuimon.ui.table import TablePanel

SIZE = (160, 48)


@asynccontextmanager
async def dashboard(source: object, **options: object) -> AsyncIterator[tuple[TuimonApp, Pilot]]:
    app = TuimonApp(source, **options)
    async with app.run_test(size=SIZE) as pilot:
        yield app, pilot


def text(node: TuimonApp | Widget, selector: str) -> str:
    """What a text widget shows (queried from the app: on the dashboard; from app.screen: on top)."""
    return str(node.query_one(selector).visual)


def shown_step(app: TuimonApp) -> int | None:
    """The step number in the header, as the user reads it."""
    header = text(app, "#header")
    if "step " not in header:
        return None
    value = header.split("step ")[1].split()[0].replace(",", "")
    return int(value) if value.isdigit() else None


def chart_text(app: TuimonApp) -> str:
    """What the chart shows (its rendered plot as plain text)."""
    return app.query_one(PlotextPlot).render().plain


def cell(table: Widget, row: str, column: str) -> str:
    return str(table.get_cell(row, column))


async def played_to_end(app: TuimonApp, pilot: Pilot) -> None:
    await wait_for_screen(pilot, lambda: "ENDED: completed" in text(app, "#header"), what="the run's end")
    await wait_for_screen(pilot, lambda: "last" in chart_text(app), what="the chart")


async def test_dashboard_shows_a_whole_run(recording: Path) -> None:
    async with dashboard(ReplaySource([recording], speed=math.inf)) as (app, pilot):
        await played_to_end(app, pilot)
        header = text(app, "#header")
        for expected in (
            "synthetic",
            "host testhost",
            "rank 0 │",  # one rank, named as one (a bare "ranks 0" read as "no ranks")
            "step 299",
            "1289 samples/s (20 steps avg)",
            "SIMULATED GPUs",
            "REPLAY max",
        ):
            assert expected in header
        cards = {card.id: str(card.visual) for card in app.query(GpuCard)}
        assert sorted(cards) == ["gpu-0-0", "gpu-0-1", "gpu-0-2", "gpu-0-3"]
        assert "◀ OUTLIER util 10% vs 95%" in cards["gpu-0-2"]
        assert app.query_one("#gpu-0-2").has_class("-outlier")
        assert "⚠ THROTTLE hw_thermal" in cards["gpu-0-1"]
        assert all("util" in c and "mem" in c and "temp" in c and "power" in c for c in cards.values())
        assert app.query_one("#gpus").border_title == "GPUs  SIMULATED"
        invariants = app.query_one(InvariantTable)
        assert cell(invariants, "grads_cleared", "status") == "✖ VIOLATED"
        assert cell(invariants, "optimizer_changes_params", "status") == "✔ ok"
        assert "1 VIOLATED" in str(invariants.framed_by.border_title)
        events = app.query_one(EventLog)
        assert events.row_count == 2
        assert cell(events, "0-1", "count") == "×2" and cell(events, "0-1", "severity") == "▲ WARN"
        assert cell(events, "0-2", "severity") == "✖ CRIT"
        assert "loss  last" in chart_text(app)
        assert "received" in text(app, "#status") and "malformed 0" in text(app, "#status")


async def test_live_step_advances_and_malformed_frames_show_in_the_status_line(
    raw_publisher: RawPublisher,
) -> None:
    source = LiveSource([raw_publisher.endpoint])
    async with dashboard(source) as (app, pilot):
        step = 0

        def publish_until(target: int) -> bool:
            """Publish one more step; true once the header shows ``target`` or later."""
            nonlocal step
            raw_publisher.metrics(step, loss=1.0 / (step + 1))
            if step % 5 == 0:
                raw_publisher.heartbeat(step)
            step += 1
            shown = shown_step(app)
            return shown is not None and shown >= target

        raw_publisher.send(raw_publisher.builder.run_start())
        await wait_for_screen(pilot, lambda: publish_until(0), what="the first steps")
        first = shown_step(app)
        await wait_for_screen(pilot, lambda: publish_until(first + 20), what="the step advancing")
        assert "raw" in text(app, "#header") and "● LIVE" in text(app, "#header")
        for frame in (b"garbage", b'{"v": 7}', b"{}"):
            raw_publisher.pub.send(frame)
        await wait_for_screen(
            pilot, lambda: "malformed 3" in text(app, "#status"), what="the malformed count"
        )
        assert "not JSON" in text(app, "#status") and "wrong version" in text(app, "#status")
        await wait_for_screen(pilot, lambda: publish_until(first + 40), what="the app still working")


async def test_messages_lost_on_the_way_show_as_gaps_on_the_status_line(raw_publisher: RawPublisher) -> None:
    """What a full queue loses (a publisher's or the viewer's own high-water mark, ZeroMQ dropping
    silently) leaves holes in ``seq``: the status line counts them, and the run goes on."""
    async with dashboard(LiveSource([raw_publisher.endpoint])) as (app, pilot):
        step = 0

        def publish() -> None:
            nonlocal step
            raw_publisher.metrics(step, loss=1.0)
            step += 1

        raw_publisher.send(raw_publisher.builder.run_start())
        await wait_for_screen(pilot, lambda: publish() or shown_step(app) is not None, what="the run")
        assert "gaps 0" in text(app, "#status")
        raw_publisher.builder.seq += 1_234  # as if 1,234 messages had been dropped by a full queue
        await wait_for_screen(
            pilot, lambda: publish() or "gaps 1,234" in text(app, "#status"), what="the gap counted"
        )
        before = shown_step(app)
        await wait_for_screen(pilot, lambda: publish() or (shown_step(app) or 0) > (before or 0) + 5,
                              what="the run going on")


async def test_selecting_an_event_shows_its_details(recording: Path) -> None:
    async with dashboard(ReplaySource([recording], speed=math.inf)) as (app, pilot):
        await played_to_end(app, pilot)
        await pilot.press("e", "up", "enter")
        screen = app.screen
        assert isinstance(screen, EventDetailScreen) and screen.event.id == "0-1"
        detail = text(app.screen, "#event-detail")
        for expected in (
            "▲ WARN",
            "loss_spike at step 120",
            "×2",
            "loss spiking again at 130",
            "what it means: loss jumped far above its recent level",
            "likely causes:",
            "• a corrupted batch",
            "Around this step",
            "▶ 120",
        ):
            assert expected in detail
        await pilot.press("escape")
        assert not isinstance(app.screen, EventDetailScreen)
        app.query_one(EventLog).move_cursor(row=1)
        app.dashboard.action_event_details()
        await pilot.pause()
        assert app.screen.event.id == "0-2" and "loss is nan at step 200" in text(app.screen, "#event-detail")


async def test_enter_opens_the_highlighted_event_whatever_arrives_meanwhile(
    raw_publisher: RawPublisher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Live events arrive while the user picks one: the cursor stays on the event highlighted
    (not on the newest, not on the row of the same index once the oldest rows are dropped), and
    enter opens that one."""
    monkeypatch.setattr("tuimon.ui.dashboard.events.MAX_ROWS", 3)
    async with dashboard(LiveSource([raw_publisher.endpoint])) as (app, pilot):
        log = app.query_one(EventLog)
        rows = lambda: [log.coordinate_to_cell_key((row, 0)).row_key.value for row in range(log.row_count)]  # noqa: E731

        def send_events(*numbers: int) -> None:
            for n in numbers:
                raw_publisher.send_new("event", step=n, id=f"0-{n}", severity="warning", kind="loss_spike",
                                       message=f"loss spike number {n}", details={}, count=1)

        def publish_until_shown() -> bool:
            raw_publisher.send(raw_publisher.builder.run_start())
            raw_publisher.metrics(0, loss=1.0)
            return shown_step(app) is not None

        await wait_for_screen(pilot, publish_until_shown, what="the run")
        send_events(1, 2, 3)
        await wait_for_screen(pilot, lambda: rows() == ["0-1", "0-2", "0-3"], what="three events")
        await pilot.press("e")  # the newest, event 3, highlighted: the user reads it
        assert log.highlighted_key == "0-3"
        send_events(4, 5)  # events 1 and 2 are dropped from the log, event 3 moves to its top
        await wait_for_screen(pilot, lambda: rows() == ["0-3", "0-4", "0-5"], what="two more events")
        detail_line = str(app.query_one("#events-panel .row-detail").visual)
        assert log.highlighted_key == "0-3" and "loss spike number 3" in detail_line
        await pilot.press("enter")
        await wait_for_screen(pilot, lambda: isinstance(app.screen, EventDetailScreen), what="the details")
        assert app.screen.event.id == "0-3"
        assert "loss spike number 3" in text(app.screen, "#event-detail")


async def test_a_run_without_gpus_says_so_and_how_to_simulate_them(tmp_path: Path) -> None:
    """``gpu_source: none`` in run_start: no readings will ever come, so the panel says so instead
    of waiting for them; a run that reads GPUs but sent none yet is still "waiting"."""
    without = [m for m in synthetic_run("cpu-only", steps=50) if m["type"] != "gpu"]
    without[0]["gpu_source"] = "none"
    waiting = [m for m in synthetic_run("not-yet", steps=50, t0=1_700_000_001.0) if m["type"] != "gpu"]
    recordings = [write_recording(tmp_path / f"{run[0]['run']}.jsonl", run) for run in (without, waiting)]
    async with dashboard(ReplaySource(recordings, speed=math.inf), run="cpu-only") as (app, pilot):
        panel = lambda: text(app, "#gpus .gpu-empty")  # noqa: E731
        await wait_for_screen(pilot, lambda: "no GPUs on this run's host" in panel(), what="no GPUs")
        assert "(gpu_source: none)" in panel()
        assert "tuimon run --gpu simulated" in panel() and 'Monitor(gpu="simulated")' in panel()
        await pilot.press("r")
        await wait_for_screen(pilot, lambda: "not-yet" in text(app, "#header"), what="the other run")
        await wait_for_screen(pilot, lambda: panel() == "no GPU data yet", what="waiting for GPUs")


async def test_event_context_for_other_screens(recording: Path) -> None:
    async with dashboard(ReplaySource([recording], speed=math.inf)) as (app, pilot):
        await played_to_end(app, pilot)
        app.query_one(EventLog).move_cursor(row=0)
        context = app.dashboard.event_context(before=3, after=3)
        assert context.run == "synthetic" and context.event.kind == "loss_spike"
        assert context.window["loss"][0] == [117, 118, 119, 120, 121, 122, 123]
        assert context.window["loss"][1][3] == 50.0


async def test_replay_keys_pause_speed_and_seek_change_the_screen(recording: Path) -> None:
    async with dashboard(ReplaySource([recording], speed=1.0, paused=True)) as (app, pilot):
        await wait_for_screen(pilot, lambda: "❚❚ PAUSED 1×" in text(app, "#header"), what="paused")
        await pilot.press("end")
        await wait_for_screen(pilot, lambda: "step 299" in text(app, "#header"), what="the end")
        assert "100%" in text(app, "#header")
        await pilot.press("home")
        await wait_for_screen(pilot, lambda: "step 0 " in text(app, "#header"), what="the start")
        assert app.query_one(EventLog).row_count == 0
        await pilot.press("right", "right")
        await wait_for_screen(pilot, lambda: "step 200 " in text(app, "#header"), what="+20 s")
        await pilot.press("left")
        await wait_for_screen(pilot, lambda: "step 100 " in text(app, "#header"), what="-10 s")
        # Seeking back rebuilds the store; the GPU cards must survive it (they once vanished).
        await pilot.pause(0.5)
        assert len(app.query(GpuCard)) == 4
        await pilot.press("plus", "plus")
        await wait_for_screen(pilot, lambda: "PAUSED 4×" in text(app, "#header"), what="4x")
        await pilot.press("minus", "minus", "minus")
        await wait_for_screen(pilot, lambda: "PAUSED 0.5×" in text(app, "#header"), what="0.5x")
        await pilot.press("plus", "plus", "plus", "plus", "plus", "space")
        await wait_for_screen(pilot, lambda: "▶ REPLAY 16×" in text(app, "#header"), what="playing at 16x")
        await wait_for_screen(pilot, lambda: "step 100 " not in text(app, "#header"), what="steps moving")


async def test_chart_keys_choose_the_metric(recording: Path) -> None:
    async with dashboard(ReplaySource([recording], speed=math.inf)) as (app, pilot):
        await played_to_end(app, pilot)
        chart = app.query_one(MetricChart)
        assert chart.names[:4] == ["loss", "lr", "grad_norm", "samples_per_s"]
        titles = {"grad_norm": "grad_norm", "samples_per_s": "samples_per_s (samples/s)", "loss": "loss",
                  "lr": "lr"}  # with the unit where the metric has one
        for key, metric in (("g", "grad_norm"), ("s", "samples_per_s"), ("l", "loss"), ("c", "lr")):
            await pilot.press(key)
            await pilot.pause(0.1)
            assert chart.metric == metric
            assert f"{titles[metric]}  last" in chart_text(app)


async def test_the_palette_screenshot_lands_in_the_working_folder(
    recording: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "no-downloads-here"))
    async with dashboard(ReplaySource([recording], speed=math.inf)) as (app, pilot):
        await played_to_end(app, pilot)
        await pilot.press("ctrl+p")
        await paste(pilot, "screenshot")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for_screen(pilot, lambda: list(tmp_path.glob("*.svg")), what="the screenshot")
    (shot,) = tmp_path.glob("*.svg")
    assert "ENDED" in shot.read_text() and "loss" in shot.read_text()


async def test_run_key_switches_between_runs(tmp_path: Path) -> None:
    first = write_recording(tmp_path / "a.jsonl", synthetic_run("alpha", steps=50))
    second = write_recording(tmp_path / "b.jsonl", synthetic_run("beta", steps=80, t0=1_700_000_001.0))
    async with dashboard(ReplaySource([first, second], speed=math.inf), run="beta") as (app, pilot):
        await wait_for_screen(pilot, lambda: "step 79" in text(app, "#header"), what="beta shown first")
        await pilot.press("r")
        await wait_for_screen(pilot, lambda: "alpha" in text(app, "#header"), what="alpha")
        assert "step 49" in text(app, "#header") and app.dashboard.run_name == "alpha"
        await pilot.press("r")
        await wait_for_screen(pilot, lambda: "beta" in text(app, "#header"), what="beta again")


async def test_a_run_that_starts_while_another_is_shown_is_announced_and_r_shows_it(
    raw_publisher: RawPublisher,
) -> None:
    """Only the "received" count would change otherwise: a notice names the new run and its key."""
    async with dashboard(LiveSource([raw_publisher.endpoint])) as (app, pilot):
        raw_publisher.send(raw_publisher.builder.run_start())

        def shown() -> str | None:
            raw_publisher.metrics(1, 1.0)
            return app.dashboard.run_name

        await wait_for_screen(pilot, lambda: shown() == "raw", what="the first run")
        raw_publisher.send_new("run_end", 1, status="completed")
        raw_publisher.builder = RunBuilder("fresh", t0=time.time())
        raw_publisher.send(raw_publisher.builder.run_start())

        def announced() -> bool:
            raw_publisher.metrics(1, 1.0)
            return any(n.title == "A new run started" and "fresh" in n.message and "r shows it" in n.message
                       for n in app._notifications)

        await wait_for_screen(pilot, announced, what="the new run announced")
        assert app.dashboard.run_name == "raw", "announced, not switched to under the reader's eyes"
        await pilot.press("r")
        await wait_for_screen(pilot, lambda: "fresh" in text(app, "#header"), what="the new run shown")


async def test_at_80_columns_the_footer_shows_whole_keys_and_the_header_one_line(recording: Path) -> None:
    """Keys that do not fit are left out whole, the help key saying there are more; the header
    leaves out its least useful fields rather than wrap."""
    app = TuimonApp(ReplaySource([recording], speed=math.inf))
    async with app.run_test(size=(80, 24)) as pilot:
        await played_to_end(app, pilot)
        await pilot.pause(0.1)
        keys = [(key.key_display, key.description, key.region) for key in app.screen.query(FooterKey)]
        shown = {display for display, _, _ in keys}
        assert {"q", "?", "v", "e", "i", "o", "h"} <= shown, keys
        assert all(region.right <= 80 for _, _, region in keys), "no key runs past the edge"
        assert ("?", "More") in {(display, description) for display, description, _ in keys}
        header = text(app, "#header").splitlines()[0]
        assert len(header) <= 78 and "SIMULATED GPUs" in header and "■ ENDED" in header, header


async def test_help_screen_lists_every_footer_key(recording: Path) -> None:
    async with dashboard(ReplaySource([recording], speed=math.inf)) as (app, pilot):
        shown = [b.binding for b in app.screen.active_bindings.values() if b.binding.show]
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        help_text = statics_text(app.screen)
        for binding in shown:
            assert app.get_key_display(binding) in help_text
        assert "Replay only" in help_text and "✖ VIOLATED" in help_text
        dark = accent(app)
        assert key_colours(app) == {dark}
        app.theme = "tuimon-light"  # from the command palette, the help still open
        await wait_for_screen(pilot, lambda: accent(app) != dark, what="the light theme's accent")
        await wait_for_screen(pilot, lambda: key_colours(app) == {accent(app)}, what="keys in the new accent")
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


def key_colours(app: TuimonApp) -> set[tuple[int, int, int]]:
    """The colours the help draws its keys in (each section's first column)."""
    colours = set()
    for static in app.screen.query(".help-entries").results(Static):
        table = static.content
        assert isinstance(table, Table)
        colour = table.columns[0].style
        assert isinstance(colour, Style) and colour.color is not None
        colours.add(tuple(colour.color.get_truecolor()))
    return colours


def accent(app: TuimonApp) -> tuple[int, int, int]:
    """The accent the app's CSS draws with now (it follows a theme change at the next refresh)."""
    return tuple(RichColor.parse(app.theme_variables["accent"]).get_truecolor())


async def test_every_footer_key_does_something(recording: Path) -> None:
    """Each key the footer offers, pressed, changes what the user sees (or quits)."""
    async with dashboard(ReplaySource([recording], speed=math.inf)) as (app, pilot):
        await played_to_end(app, pilot)
        footer_keys = {key for key, b in app.screen.active_bindings.items() if b.binding.show}
        effects = {
            "question_mark": lambda: isinstance(app.screen, HelpScreen),
            "t": lambda: app.theme == "tuimon-light",
            "r": lambda: "only one run so far" in str([n.message for n in app._notifications]),
            "l": lambda: app.query_one(MetricChart).metric == "loss",
            "g": lambda: app.query_one(MetricChart).metric == "grad_norm",
            "s": lambda: app.query_one(MetricChart).metric == "samples_per_s",
            "c": lambda: app.query_one(MetricChart).metric == "lr",
            "e": lambda: app.focused is app.query_one(EventLog),
            "enter": lambda: isinstance(app.screen, EventDetailScreen),
            "i": lambda: isinstance(app.screen, IncidentScreen),
            "o": lambda: isinstance(app.screen, IncidentScreen),
            "h": lambda: isinstance(app.screen, LayerScreen),
            "j": lambda: "No job view here" in str([n.title for n in app._notifications]),
            "space": lambda: "PAUSED" in text(app, "#header"),
            "plus": lambda: "PAUSED max" not in text(app, "#header"),
            "minus": lambda: "64×" in text(app, "#header"),
            "home": lambda: "step 0 " in text(app, "#header"),
            "right": lambda: "step 100 " in text(app, "#header"),
            "left": lambda: "step 0 " in text(app, "#header"),
            "end": lambda: "step 299 " in text(app, "#header"),
        }
        assert footer_keys - {"q"} == set(effects)
        for key in (
            "question_mark",
            "t",
            "r",
            "g",
            "l",
            "s",
            "c",
            "e",
            "enter",
            "i",
            "o",
            "h",
            "j",
            "space",
            "minus",
            "plus",
            "home",
            "right",
            "left",
            "end",
        ):
            if isinstance(app.screen, (HelpScreen, EventDetailScreen, IncidentScreen, LayerScreen)):
                await pilot.press("escape")
            if key == "c":
                await pilot.press("l")  # the next chart after the loss is the lr
            if key == "minus":
                app.source.set_speed(math.inf)
            await pilot.press(key)
            await wait_for_screen(pilot, effects[key], what=f"the effect of {key!r}")
        await pilot.press("q")
        await pilot.pause()
        assert app.return_code == 0 and not app.is_running


async def test_live_source_hides_the_replay_keys(raw_publisher: RawPublisher) -> None:
    async with dashboard(LiveSource([raw_publisher.endpoint])) as (app, pilot):
        footer_keys = {key for key, b in app.screen.active_bindings.items() if b.binding.show}
        assert {"space", "plus", "minus", "left", "right", "home", "end"}.isdisjoint(footer_keys)
        assert {"q", "question_mark", "t", "l", "g", "s", "e"} <= footer_keys
        await pilot.press("space", "left")  # nothing to pause or seek: no error either


async def test_command_palette_switches_theme_and_chart(recording: Path) -> None:
    async with dashboard(ReplaySource([recording], speed=math.inf)) as (app, pilot):
        await played_to_end(app, pilot)
        await pilot.press("ctrl+p")
        await paste(pilot, "theme tuimon-contrast")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for_screen(pilot, lambda: app.theme == "tuimon-contrast", what="the contrast theme")
        await pilot.press("ctrl+p")
        await paste(pilot, "chart grad_norm")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for_screen(
            pilot, lambda: app.query_one(MetricChart).metric == "grad_norm", what="grad_norm"
        )


async def test_waiting_screen_when_no_run_is_registered(tmp_path: Path) -> None:
    async with dashboard(LiveSource(registry_dir=tmp_path)) as (app, pilot):
        await wait_for_screen(
            pilot, lambda: "waiting for runs" in text(app, "#header"), what="the waiting notice"
        )
        header = text(app, "#header")
        assert "no run yet" in header and str(tmp_path) in header and "tuimon run" in header
        await pilot.press("enter", "r")  # no event, no run: a notice, not a crash
        assert app.is_running


async def test_panels_are_redrawn_only_when_what_they_show_changes(recording: Path) -> None:
    source = ReplaySource([recording], speed=1.0, paused=True)
    async with dashboard(source) as (app, pilot):
        await pilot.press("end")
        await wait_for_screen(pilot, lambda: "step 299" in text(app, "#header"), what="the end")
        await wait_for_screen(pilot, lambda: "last" in chart_text(app), what="the chart")
        await pilot.pause(1.0)  # every panel has drawn the paused state
        redraws: Counter[str] = Counter()
        panels = {"header": RunHeader, "gpus": GpuPanel, "invariants": InvariantTable, "events": EventLog}
        for name, kind in panels.items():
            widget = app.query_one(kind)
            widget.show = counted(widget.show, name, redraws)
        plot = app.query_one(PlotextPlot)
        plot.refresh = counted(plot.refresh, "chart", redraws)
        await pilot.pause(2.0)  # 8 number ticks and 2 chart ticks with nothing new
        assert redraws == Counter()
        await pilot.press("home")  # the store is rebuilt: everything is drawn again
        await wait_for_screen(pilot, lambda: set(redraws) == {*panels, "chart"}, what="all panels redrawn")


async def test_a_frame_drawn_before_the_table_measures_its_rows_does_not_cut_their_messages() -> None:
    """On a busy event loop a frame can be drawn between ``add_row`` and the table's measure; the
    cells it cached at the header's width must not outlive the measure (the end of a replay has no
    later update to replace them)."""

    class OneLog(App):
        def compose(self) -> ComposeResult:
            yield TablePanel(EventLog())

    message = "loss 43.8 at step 168, rank 0 is 56.3x its recent mean"
    async with OneLog().run_test(size=(160, 12)) as pilot:
        log = pilot.app.query_one(EventLog)
        log.show([EventRecord("e1", 0, 168, "warning", "loss_spike", message, {}, 1, 0.0, 0.0)])
        for y in range(log.size.height):  # the early frame
            log.render_line(y)
        await pilot.pause(0.2)
        assert message in "\n".join(log.render_line(y).text for y in range(log.size.height))


def counted(method: Callable[..., object], name: str, calls: Counter[str]) -> Callable[..., object]:
    def wrapper(*args: object, **kwargs: object) -> object:
        calls[name] += 1
        return method(*args, **kwargs)

    return wrapper


def test_chart_envelope_keeps_spikes_and_bounds_the_points() -> None:
    steps = list(range(200_000))
    values = [1.0] * len(steps)
    values[123_457] = 80.0  # a one-step loss spike
    values[150_000] = math.nan
    xs, ys = envelope(steps, values, 150)
    assert len(xs) <= 300 and max(ys) == 80.0 and xs[ys.index(80.0)] == 123_457
    assert all(math.isfinite(y) for y in ys) and xs == sorted(xs)


async def test_a_small_terminal_shows_one_panel_at_a_time_with_every_message_whole(tmp_path: Path) -> None:
    """At 80x24 the four panels cannot share the screen: one fills it, the tab bar names the
    others, v and the panels' own keys bring them forward, and a row's whole message (with its
    brackets: a peer's text is never read as markup) wraps on the detail line."""
    messages = synthetic_run(steps=200)
    long = "[simulated GPUs] " + "GPU 2 averaged 10% busy while the others ran at 94% " * 2
    event = RunBuilder("synthetic").event(199, "0-9", "gpu_imbalance", "warning", long)
    messages.insert(-1, event | {"ts": messages[-2]["ts"]})
    for seq, message in enumerate(messages):
        message["seq"] = seq
    recording = write_recording(tmp_path / "run.jsonl", messages)
    app = TuimonApp(ReplaySource([recording], speed=math.inf))
    async with app.run_test(size=(80, 24)) as pilot:
        await played_to_end(app, pilot)
        panels = "#gpus, #chart, #invariants-panel, #events-panel"
        shown = lambda: {w.id for w in app.query(panels) if w.display}  # noqa: E731
        assert shown() == {"chart"} and app.query_one("#header").region.y == 0  # nothing scrolled off
        assert "v" in {key for key, b in app.screen.active_bindings.items() if b.binding.show}
        for expected in ("gpus", "invariants-panel", "events-panel", "chart"):
            await pilot.press("v")
            assert shown() == {expected}
        await pilot.press("e")
        assert shown() == {"events-panel"} and app.focused is app.query_one(EventLog)
        await pilot.press("end")  # (replay: to the end; the cursor follows the newest event)
        detail = app.query_one("#events-panel .row-detail")
        await wait_for_screen(pilot, lambda: "gpu_imbalance" in str(detail.visual), what="the detail line")
        assert " ".join(str(detail.visual).split()).endswith(" ".join(long.split()))
        assert detail.size.height >= 2  # wrapped, not cut
        await pilot.press("g")
        assert shown() == {"chart"} and app.query_one(MetricChart).metric == "grad_norm"
        await pilot.resize_terminal(160, 48)  # wide again: all four, and v is no longer offered
        await pilot.pause(0.2)
        assert shown() == {"gpus", "chart", "invariants-panel", "events-panel"}
        assert "v" not in {key for key, b in app.screen.active_bindings.items() if b.binding.show}


async def test_the_header_says_where_a_stalled_run_waits_until_its_steps_resume() -> None:
    """Two ranks: rank 1 blocks in its data fetch, rank 0 waits in the all-reduce. The header names
    rank 1 with its function and line, from the heartbeats' stall fields (the one verdict of
    publisher/wire/stall.py), says one rank waits for it, counts the seconds, and clears when the
    steps resume."""
    from helpers.runs import T0, decoded
    from helpers.sources import FedSource

    from tuimon.sink import Batch
    from tuimon.store import Store

    clock = [T0]
    store = Store(clock=lambda: clock[0])
    ranks = [RunBuilder("gloo", rank) for rank in (0, 1)]
    fetching = ["/home/u/train.py:40 train", "/home/u/train.py:4 fetch_batch"]
    waiting = ["/home/u/train.py:44 train",
               "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:2800 all_reduce"]

    def deliver(make: Callable[[RunBuilder], dict[str, object]]) -> None:
        for builder in ranks:
            builder.ts = clock[0]
        store.deliver(Batch([decoded(make(builder)) for builder in ranks]))

    def beat(builder: RunBuilder, step: int, stalled_s: float) -> dict[str, object]:
        stuck = builder.rank == 1
        fields = {"stalled_s": stalled_s, "stall_after_s": 5.0}
        if stalled_s >= 2.5:
            fields |= {"stack": fetching if stuck else waiting, "in_collective": not stuck, "cpu_share": 0.0,
                       "io_bytes_per_s": 0, "same_place": True}
        return builder.message("heartbeat", step=step, snapshot="tcp://127.0.0.1:1", stats={}, **fields)

    deliver(RunBuilder.run_start)
    for step in range(1, 21):
        clock[0] += 0.1
        deliver(lambda builder, step=step: builder.metrics(step, loss=1.0 / step))
    deliver(lambda builder: beat(builder, 20, 0.05))
    app = TuimonApp(FedSource(store))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for_screen(pilot, lambda: shown_step(app) == 20, what="step 20")
        assert "stuck" not in text(app, "#header")
        for stalled in (1.0, 3.0, 4.0):  # under the threshold: nothing said yet
            clock[0] += 1.0
            deliver(lambda builder, s=stalled: beat(builder, 20, s))
        await pilot.pause(0.3)
        assert "stuck" not in text(app, "#header") and "waiting" not in text(app, "#header")
        clock[0] += 8.0
        deliver(lambda builder: beat(builder, 20, 12.0))
        stalled = "⚠ rank 1 stuck 12 s in fetch_batch (train.py:4), 1 waiting for it"
        await wait_for_screen(pilot, lambda: stalled in text(app, "#header"), what="the stall in the header")
        clock[0] += 1.0  # no heartbeat yet: the seconds go on
        await wait_for_screen(pilot, lambda: "stuck 13 s in fetch_batch" in text(app, "#header"),
                              what="the stall counted on")
        clock[0] += 0.5
        deliver(lambda builder: builder.metrics(21, loss=0.04))
        await wait_for_screen(pilot, lambda: "stuck" not in text(app, "#header"), what="the stall cleared")
        assert shown_step(app) == 21 and "● LIVE" in text(app, "#header")
