"""The screens as a user sees them, pinned as SVG snapshots (pytest-textual-snapshot).

The data is fixed, so a snapshot changes only when the look changes:

- ``tests/data/demo_run.jsonl``: a recording of the real demo (``tuimon demo``: a small MLP trained
  on the CPU, four simulated GPUs, a loss spike, a NaN loss, GPU 2 starving, GPU 1 throttling);
- ``tests/data/kb/*.md``: three exported incidents, imported into a fresh knowledge base at a
  fixed path (the incident screen shows where its knowledge base is), their times moved into the
  current year (the screen shows the year only for other years) and shown in UTC;
- ``conftest.job_batches``: a job of 512 nodes of 8 GPUs as a viewer at the root relay receives it
  (node summaries made by the relay's own summarizer, every relay's beat, the root's findings),
  in a store whose clock is fixed a second after the last message.

The live dashboard reads the same recording from a real ZeroMQ socket, its store's clock fixed
just after the last message so that "elapsed" and "LIVE" read the same on every run.

After a deliberate change of the look: ``.venv/bin/python -m pytest tests/test_snapshots.py
--snapshot-update``, look at the changed SVGs in ``tests/__snapshots__/test_snapshots/`` (any
browser shows them), and commit them with the change. A failing run writes
``snapshot_report.html`` with the old and new pictures side by side.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers.jobs import big_job, job_batches, job_store
from helpers.sources import FedSource
from helpers.waiting import wait_for_screen
from textual.pilot import Pilot
from textual.screen import Screen
from textual.widget import Widget

from publisher.wire.protocol import encode
from publisher.wire.recorder import read_recording
from tuimon.kb import KnowledgeBase
from tuimon.sources.live import LiveSource
from tuimon.sources.replay import ReplaySource
from tuimon.ui.app import TuimonApp
from tuimon.ui.dashboard.charts import MetricChart
from tuimon.ui.event_detail import EventDetailScreen
from tuimon.ui.help import HelpScreen
from tuimon.ui.incidents.runbook_checklist import RunbookChecklist
from tuimon.ui.incidents.screen import IncidentScreen
from tuimon.ui.job.band import LossBand
from tuimon.ui.job.grid import JobGrid
from tuimon.ui.job.node_screen import NodeScreen, NodeTable
from tuimon.ui.job.problem_list import ProblemList
from tuimon.ui.job.screen import JobScreen
from tuimon.ui.layers.history import LayerHistoryChart
from tuimon.ui.layers.screen import LayerScreen
from tuimon.ui.themes import THEME_ORDER

DATA = Path(__file__).resolve().parent / "data"
RECORDING = DATA / "demo_run.jsonl"
INCIDENTS = DATA / "kb"
#: The year the incident fixtures were written in; moved to the current one when imported.
FIXTURE_YEAR = "2026"
#: Fixed paths: they appear on screen (the knowledge base's location, the live endpoint).
KB_DIR = Path("/tmp/tuimon-snapshots/kb")
LIVE_ENDPOINT = "ipc:///tmp/tuimon-snapshots/live.sock"
SIZES = {"160x48": (160, 48), "80x24": (80, 24)}
#: Screens whose boxes and panes must fit the common small terminals too.
SMALL_SIZES = {"80x24": (80, 24), "100x30": (100, 30)}
ALL_SIZES = {**SIZES, **SMALL_SIZES}

Snap = Callable[..., bool]


def recorded_messages() -> list[dict[str, Any]]:
    messages = [message for _, _, message in read_recording(RECORDING)]
    assert all(isinstance(message, dict) for message in messages), "the fixture recording has bad lines"
    return messages  # type: ignore[return-value]


MESSAGES = recorded_messages()
LAST_STEP = max(m["step"] for m in MESSAGES if m["type"] == "metrics")


@pytest.fixture
def fixed_paths() -> Iterator[None]:
    root = KB_DIR.parent
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    yield
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Times on screen in UTC, whatever the machine's zone."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def knowledge_base(fixed_paths: None, utc: None, tmp_path: Path) -> Path:
    """The three fixture incidents, imported as a team imports a colleague's export."""
    year = str(datetime.now().year)
    for source in INCIDENTS.glob("*.md"):
        (tmp_path / source.name).write_text(source.read_text().replace(f"{FIXTURE_YEAR}-", f"{year}-"))
    with KnowledgeBase.open(KB_DIR, author="snapshot") as kb:
        report = kb.import_files(sorted(tmp_path.glob("*.md")))
    assert not report.problems, report.problems
    return KB_DIR


def chart_drawn(app: TuimonApp) -> bool:
    """The chart shows the store's latest data (it redraws on its own, slower timer)."""
    if app.dashboard.run_name is None:
        return False
    versions = app.store.versions(app.dashboard.run_name)
    return app.query_one(MetricChart).drawn_version == (versions["metrics"], versions["events"])


async def replay_to_end(pilot: Pilot) -> None:
    """The whole recording played, every panel drawn with its final data."""
    app = pilot.app
    assert isinstance(app, TuimonApp)
    view = lambda: app.store.run_view("demo")  # noqa: E731
    await wait_for_screen(pilot, lambda: view() is not None and view().health == "ended", what="the end")
    await wait_for_screen(pilot, lambda: chart_drawn(app), what="the chart")
    await pilot.pause(0.6)  # every timer has fired on the final data at least once


def replay_app(theme: str = "tuimon-dark", kb_dir: Path | None = None) -> TuimonApp:
    source = ReplaySource([RECORDING], speed=math.inf)
    return TuimonApp(source, theme=theme, kb_dir=str(kb_dir) if kb_dir else None)


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
@pytest.mark.parametrize("theme", THEME_ORDER)
def test_dashboard_replay(snap_compare: Snap, theme: str, size: tuple[int, int]) -> None:
    assert snap_compare(replay_app(theme), terminal_size=size, run_before=replay_to_end)


@pytest.mark.parametrize("view_key", ["v", "e"], ids=["gpus", "events"])
def test_small_terminal_views(snap_compare: Snap, view_key: str) -> None:
    """At 80x24 the dashboard shows one panel at a time: the GPUs, and the events with the
    selected one's whole message on the detail line."""

    async def view(pilot: Pilot) -> None:
        await replay_to_end(pilot)
        await pilot.press(view_key)
        await pilot.pause(0.3)

    assert snap_compare(replay_app(), terminal_size=SIZES["80x24"], run_before=view)


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_dashboard_live(snap_compare: Snap, fixed_paths: None, size: tuple[int, int]) -> None:
    """The recording sent on a real PUB socket, received by the real live source."""
    last_ts = max(m["ts"] for m in MESSAGES)
    frames = []
    for message in MESSAGES:
        if message["type"] == "run_end":
            continue  # the run is still going, as far as this viewer knows
        if message["type"] == "heartbeat":
            message = {k: v for k, v in message.items() if k != "snapshot"}  # its publisher is gone
        frames.append(encode(message))
    source = LiveSource([LIVE_ENDPOINT], clock=lambda: last_ts + 0.5)
    context = zmq.Context()
    pub = context.socket(zmq.XPUB)
    pub.sndhwm = 0
    pub.linger = 0
    pub.bind(LIVE_ENDPOINT)

    async def publish(pilot: Pilot) -> None:
        app = pilot.app
        assert isinstance(app, TuimonApp)
        await wait_for_screen(pilot, lambda: pub.poll(0, zmq.POLLIN), what="the viewer's subscription")
        pub.recv()
        for frame in frames:
            pub.send(frame)
        view = lambda: app.store.run_view("demo")  # noqa: E731
        await wait_for_screen(
            pilot, lambda: view() is not None and view().step == LAST_STEP, what="the last step"
        )
        await wait_for_screen(pilot, lambda: chart_drawn(app), what="the chart")
        await pilot.pause(0.6)

    try:
        assert snap_compare(TuimonApp(source), terminal_size=size, run_before=publish)
    finally:
        context.destroy(linger=0)


async def open_detail(pilot: Pilot) -> None:
    """The details of the event the log's cursor is on (the newest)."""
    await replay_to_end(pilot)
    await pilot.press("e", "enter")
    await wait_for_screen(pilot, lambda: isinstance(pilot.app.screen, EventDetailScreen), what="details")
    await pilot.pause(0.6)  # the dashboard behind, where it shows, repainted


async def open_layers(pilot: Pilot) -> None:
    """The demo's layers: gradient norms of its MLP over the run, the NaN step a red column, and
    the history of the first layer."""
    await replay_to_end(pilot)
    await pilot.press("h")
    await wait_for_screen(pilot, lambda: isinstance(pilot.app.screen, LayerScreen), what="layers")
    await pilot.press("enter")
    chart = pilot.app.screen.query_one(LayerHistoryChart)
    await wait_for_screen(pilot, lambda: chart.drawn_at_size, what="the history at its size")
    await pilot.pause(0.6)


async def open_help(pilot: Pilot) -> None:
    await replay_to_end(pilot)
    await pilot.press("question_mark")
    await wait_for_screen(pilot, lambda: isinstance(pilot.app.screen, HelpScreen), what="help")
    await pilot.pause(0.6)


async def open_incidents(pilot: Pilot) -> IncidentScreen:
    """The incident screen over the selected event, its list and banner loaded."""
    await replay_to_end(pilot)
    await pilot.press("i")
    await wait_for_screen(pilot, lambda: isinstance(pilot.app.screen, IncidentScreen), what="incidents")
    screen = pilot.app.screen
    assert isinstance(screen, IncidentScreen)
    await wait_for_screen(pilot, lambda: screen.selected_number() is not None, what="the list")
    # "Seen before" toasts time out (their presence depends on how fast this ran): not pinned.
    pilot.app.clear_notifications()
    return screen


async def open_runbook(pilot: Pilot, number: int = 1) -> None:
    """Incident ``number`` (#1: a loss spike, two runbook steps ticked) opened from the list: its
    fields, checklist and timeline."""
    screen = await open_incidents(pilot)
    while screen.selected_number() != number:
        await pilot.press("down")
    await pilot.press("enter")
    checklist = screen.query_one(RunbookChecklist)
    await wait_for_screen(pilot, lambda: checklist.option_count > 0, what="the checklist")
    await pilot.pause(0.6)


def off_screen(screen: Screen[object]) -> list[str]:
    """Widgets drawn past the terminal's edges: a box whose border or text the terminal cuts off.
    Past an edge is fine only inside a container that scrolls that way (the user scrolls to it)."""
    bounds = screen.region
    found = []
    for widget in screen.query("*"):
        region = widget.region
        if not region:
            continue  # not shown
        ancestors = [a for a in widget.ancestors if isinstance(a, Widget) and a is not screen]
        if not any(a.allow_horizontal_scroll for a in ancestors) and (
            region.x < bounds.x or region.right > bounds.right
        ):
            found.append(f"{widget!r} at {region}: beyond the width {bounds.width}")
        if not any(a.allow_vertical_scroll for a in ancestors) and (
            region.y < bounds.y or region.bottom > bounds.bottom
        ):
            found.append(f"{widget!r} at {region}: beyond the height {bounds.height}")
    return found


def drawn_whole(
    opened: Callable[[Pilot], Awaitable[object]], problems: list[str]
) -> Callable[[Pilot], Awaitable[None]]:
    """``opened``, then what the snapshot shows checked without looking: every widget of the screen
    lies within the terminal (a dialog of fixed width once lost its right border at 80x24). What is
    off screen goes to ``problems``, for the test to assert before the snapshot's comparison (an
    assertion in here would only fail the screenshot, its message lost), and also when snapshots
    are being updated."""
    async def run(pilot: Pilot) -> None:
        await opened(pilot)
        screen = pilot.app.screen
        if screen.region.size != pilot.app.size:
            problems.append(f"the screen is {screen.region.size}, the terminal {pilot.app.size}")
        problems.extend(off_screen(screen))

    return run


@pytest.mark.parametrize("size", ALL_SIZES.values(), ids=ALL_SIZES.keys())
def test_event_detail(snap_compare: Snap, size: tuple[int, int]) -> None:
    problems: list[str] = []
    matches = snap_compare(replay_app(), terminal_size=size, run_before=drawn_whole(open_detail, problems))
    assert problems == []
    assert matches


@pytest.mark.parametrize("size", ALL_SIZES.values(), ids=ALL_SIZES.keys())
def test_layer_panel(snap_compare: Snap, size: tuple[int, int]) -> None:
    problems: list[str] = []
    matches = snap_compare(replay_app(), terminal_size=size, run_before=drawn_whole(open_layers, problems))
    assert problems == []
    assert matches


@pytest.mark.parametrize("size", ALL_SIZES.values(), ids=ALL_SIZES.keys())
def test_help(snap_compare: Snap, size: tuple[int, int]) -> None:
    problems: list[str] = []
    matches = snap_compare(replay_app(), terminal_size=size, run_before=drawn_whole(open_help, problems))
    assert problems == []
    assert matches


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_incident_list(snap_compare: Snap, knowledge_base: Path, size: tuple[int, int]) -> None:
    async def listed(pilot: Pilot) -> None:
        await open_incidents(pilot)
        await pilot.pause(0.6)

    assert snap_compare(replay_app(kb_dir=knowledge_base), terminal_size=size, run_before=listed)


@pytest.mark.parametrize("size", ALL_SIZES.values(), ids=ALL_SIZES.keys())
def test_incident_with_its_runbook(snap_compare: Snap, knowledge_base: Path, size: tuple[int, int]) -> None:
    problems: list[str] = []
    matches = snap_compare(replay_app(kb_dir=knowledge_base), terminal_size=size,
                           run_before=drawn_whole(open_runbook, problems))
    assert problems == []
    assert matches


def test_a_runbook_reads_as_rendered_markdown(snap_compare: Snap, knowledge_base: Path) -> None:
    """Incident #3 (a NaN loss): its runbook's steps with ``**before**`` in bold and `code` in the
    accent colour, never the Markdown as typed."""

    async def open_third(pilot: Pilot) -> None:
        await open_runbook(pilot, 3)
        checklist = pilot.app.screen.query_one(RunbookChecklist)
        shown = "\n".join(str(checklist.get_option_at_index(i).prompt) for i in range(checklist.option_count))
        assert "written before the event's step" in shown and "**" not in shown

    assert snap_compare(replay_app(kb_dir=knowledge_base), terminal_size=(100, 30), run_before=open_third)


# ------------------------------------------------------------------------------------ the job view


@pytest.fixture
def job_app(monkeypatch: pytest.MonkeyPatch) -> Callable[..., TuimonApp]:
    """The app over a job's store (the loss band takes one point a batch: fixed data, fixed chart)."""
    monkeypatch.setattr("tuimon.store.job.BAND_PERIOD_S", 0.0)

    def make(theme: str = "tuimon-dark", batches: Any = None) -> TuimonApp:
        return TuimonApp(FedSource(job_store(big_job() if batches is None else batches)), theme=theme)

    return make


async def job_view_drawn(pilot: Pilot, problems: int = 4) -> None:
    """The job view opened by itself, every panel drawn with the store's data."""
    app = pilot.app
    await wait_for_screen(pilot, lambda: isinstance(app.screen, JobScreen), what="the job view")
    screen = app.screen
    await wait_for_screen(pilot, lambda: screen.query_one(JobGrid).nodes, what="the grid")
    band = screen.query_one(LossBand)
    await wait_for_screen(pilot, lambda: "median" in str(band.border_title), what="the band")
    await wait_for_screen(pilot, lambda: screen.query_one(ProblemList).row_count == problems, what="problems")
    await pilot.pause(0.6)


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
@pytest.mark.parametrize("theme", ["tuimon-dark", "tuimon-contrast"])
def test_job_view(
    snap_compare: Snap, job_app: Callable[..., TuimonApp], theme: str, size: tuple[int, int]
) -> None:
    """4,096 GPUs: one character each at 160x48, one a node at 80x24; a straggler, a hang, a lost
    rank marked, one straggler over; the loss band; the cursor on the first node."""
    assert snap_compare(job_app(theme), terminal_size=size, run_before=job_view_drawn)


def test_job_view_of_a_small_job(snap_compare: Snap, job_app: Callable[..., TuimonApp]) -> None:
    """Two nodes of four GPUs: each node named, its GPUs as wide cells."""

    async def drawn(pilot: Pilot) -> None:
        await job_view_drawn(pilot, problems=0)

    app = job_app(batches=job_batches(nodes=2, gpus_per_node=4))
    assert snap_compare(app, terminal_size=(160, 48), run_before=drawn)


def test_job_node_view(snap_compare: Snap, job_app: Callable[..., TuimonApp]) -> None:
    """Node 64 (the straggler's) with its ranks and GPUs, the cursor on the straggler."""

    async def node_64(pilot: Pilot) -> None:
        await job_view_drawn(pilot)
        await pilot.press("down", "down", "down", "down", "enter")
        await wait_for_screen(pilot, lambda: isinstance(pilot.app.screen, NodeScreen), what="the node view")
        table = pilot.app.screen.query_one(NodeTable)
        await wait_for_screen(pilot, lambda: table.row_count == 8, what="its ranks")
        await pilot.press(*["down"] * 5)
        await pilot.pause(0.6)

    assert snap_compare(job_app(), terminal_size=(160, 48), run_before=node_64)
