"""The job view driven by Textual's Pilot: the real app over the real store, fed real decoded
summaries (made by the node relay's own summarizer), relay beats and relay findings."""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from helpers.jobs import JOB_RUN, big_job, job_batches, job_end_ts, job_event, job_store
from helpers.runs import T0, decoded
from helpers.screens import statics_text
from helpers.sources import FedSource
from helpers.waiting import wait_for_screen
from textual.pilot import Pilot
from textual_plotext import PlotextPlot

from publisher.wire.protocol import make_message, wire_numbers
from tuimon.sink import Batch
from tuimon.store import Store
from tuimon.store.records import EventRecord
from tuimon.ui.app import TuimonApp
from tuimon.ui.dashboard.header import RunHeader
from tuimon.ui.help import HelpScreen
from tuimon.ui.job.band import LossBand, band_columns
from tuimon.ui.job.grid import JobGrid
from tuimon.ui.job.layout import choose_layout
from tuimon.ui.job.node_screen import NodeScreen, NodeTable
from tuimon.ui.job.problem_list import ProblemList
from tuimon.ui.job.problems import CURRENT_S, current_marks, job_problems
from tuimon.ui.job.screen import JobScreen

#: What a cell of the grid is drawn with in the dark theme: a level, a mark, no data.
CELL_CHARS = set("■▲❚✖·")
#: A line of the grid (not of its legend): the cursor mark or a space, then a node index.
GRID_ROW = re.compile(r"^[▶ ] *(\d+)[ \[]")


@pytest.fixture(autouse=True)
def one_band_point_per_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loss band takes a point per read of the job view (not at most every 0.5 s of the test's
    own time): what the chart shows depends on the data alone."""
    monkeypatch.setattr("tuimon.store.job.BAND_PERIOD_S", 0.0)


def without_findings(batches: tuple[tuple[dict[str, Any], ...], ...]) -> list[list[dict[str, Any]]]:
    return [[m for m in batch if m["type"] != "event"] for batch in batches]


@asynccontextmanager
async def job_app(store: Store, size: tuple[int, int] = (160, 48)) -> AsyncIterator[tuple[TuimonApp, Pilot]]:
    """The app over ``store``, its job view opened (by itself: the run has node summaries)."""
    app = TuimonApp(FedSource(store))
    async with app.run_test(size=size) as pilot:
        await wait_for_screen(pilot, lambda: isinstance(app.screen, JobScreen), what="the job view")
        await wait_for_screen(pilot, lambda: app.screen.query_one(JobGrid).nodes, what="the grid's nodes")
        yield app, pilot


def grid_lines(app: TuimonApp) -> list[str]:
    """The grid as the user sees it inside its border, legend included."""
    grid = app.screen.query_one(JobGrid)
    return [grid.render_line(y).text for y in range(grid.size.height)]


def grid_rows(app: TuimonApp) -> dict[int, str]:
    """Rows of cells by the index of their first node (legend lines left out)."""
    return {int(match[1]): line for line in grid_lines(app) if (match := GRID_ROW.match(line))}


def legend_text(app: TuimonApp) -> str:
    return "\n".join(line for line in grid_lines(app) if line.strip() and not GRID_ROW.match(line))


def cell_of(app: TuimonApp, node: int, position: int, per_row: int = 16, label: int = 4) -> str:
    """The character of GPU ``position`` of ``node``: after the row's label, each node is a
    separator and its 8 GPUs."""
    line = grid_rows(app)[node - node % per_row]
    return line[label + (node % per_row) * 9 + 1 + position]


# ----------------------------------------------------------------------------------- the grid


async def test_every_gpu_of_a_4096_gpu_job_has_its_cell_at_160x48() -> None:
    async with job_app(job_store(big_job())) as (app, pilot):
        await wait_for_screen(pilot, lambda: len(grid_rows(app)) == 32, what="32 rows of 16 nodes")
        rows = grid_rows(app)
        assert sorted(rows) == list(range(0, 512, 16)), "rows labelled with their first node"
        cells = sum(char in CELL_CHARS for line in rows.values() for char in line)
        assert cells == 4096
        assert "1 cell = 1 GPU" in legend_text(app) and "GPU utilisation" in legend_text(app)
        header = str(app.screen.query_one("#job-header").visual)
        for expected in ("job llama", "512 nodes", "4,096 ranks", "4,096 GPUs", "513 relays", "step 23"):
            assert expected in header
        assert "✖ LOST 1" in header and "❚ HANG 1" in header and "▲ SLOW 1" in header


async def test_at_80x24_a_cell_is_a_node_showing_its_worst_gpu() -> None:
    async with job_app(job_store(big_job()), size=(80, 24)) as (app, pilot):
        await wait_for_screen(pilot, lambda: len(grid_rows(app)) == 8, what="8 rows of 64 nodes")
        rows = grid_rows(app)
        cells = sum(char in CELL_CHARS | {"◆"} for line in rows.values() for char in line)
        assert cells == 512, "one character a node, the cursor's included"
        assert "1 cell = 1 node (its worst GPU)" in legend_text(app)
        assert "✖" in rows[448] and "❚" in rows[320] and "▲" in rows[64], "a node shows its problems"


async def test_m_colours_the_grid_by_the_next_figure() -> None:
    async with job_app(job_store(big_job())) as (app, pilot):
        assert "GPU utilisation 0 %" in legend_text(app) and "min 35 % r517" in legend_text(app)
        for figure in ("GPU memory used", "GPU temperature", "step time", "data wait", "compute time",
                       "GPU utilisation"):
            await pilot.press("m")
            await wait_for_screen(pilot, lambda f=figure: legend_text(app).startswith(f"{f} "), what=figure)
            assert app.screen.query_one(JobGrid).border_title == f"Job grid: {figure}"
        await pilot.press("m", "m", "m")
        assert "max 420 ms r517" in legend_text(app), "the straggler's step time is the job's worst"


async def test_a_straggler_found_by_the_relay_marks_its_cell_and_is_listed() -> None:
    batches = big_job()
    store = job_store(without_findings(batches))
    async with job_app(store) as (app, pilot):
        assert cell_of(app, 64, 5) == "■" and not app.screen.query_one(ProblemList).row_count
        store.deliver(Batch([job_event(517, "straggler", "warning", job_end_ts(), 1, "rank 517 is slow", 0)]))
        await wait_for_screen(pilot, lambda: cell_of(app, 64, 5) == "▲", what="rank 517 marked")
        assert cell_of(app, 64, 4) == "■", "only that rank's cell"
        problems = app.screen.query_one(ProblemList)
        assert problems.row_count == 1 and "1 slow" in problems.border_title
        assert [str(cell) for cell in problems.get_row_at(0)[:4]] == ["▲ SLOW", "517", "node064", "now ×1"]


async def test_arrows_and_enter_open_a_node_then_a_rank_on_the_dashboard() -> None:
    batches = big_job()
    source_store = job_store(batches)
    for rank, loss in ((0, 1.0), (517, 7.5)):  # each rank's own series, through the focus
        source_store.deliver(Batch([
            decoded(make_message("metrics", run=JOB_RUN, rank=rank, host=f"node{rank // 8:03d}", ts=T0 + step,
                                 seq=step, step=step, metrics=wire_numbers({"loss": loss + step / 100})))
            for step in range(10)
        ]))
    source = FedSource(source_store)
    app = TuimonApp(source)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for_screen(pilot, lambda: isinstance(app.screen, JobScreen), what="the job view")
        await pilot.press("down", "down", "down", "down", "right", "left")
        grid = app.screen.query_one(JobGrid)
        assert grid.cursor == 64 and "▶ node 64: node064 · ranks 512-519" in str(grid.border_subtitle)
        await pilot.press("enter")
        await wait_for_screen(pilot, lambda: isinstance(app.screen, NodeScreen), what="the node view")
        table = app.screen.query_one(NodeTable)
        await wait_for_screen(pilot, lambda: table.row_count == 8, what="the node's ranks")
        rows = [[str(cell) for cell in table.get_row_at(i)] for i in range(8)]
        assert [row[0] for row in rows] == [str(rank) for rank in range(512, 520)]
        assert rows[5][:7] == ["517", "5", "▲ SLOW", "23", "420 ms", "170 ms", "201 ms"]
        assert all(row[2] == "" for i, row in enumerate(rows) if i != 5), "only the straggler has a problem"
        await pilot.press(*["down"] * 5, "enter")
        await wait_for_screen(pilot, lambda: app.screen is app.dashboard, what="the dashboard")
        assert app.dashboard.focus_rank == 517 and source.focused == [(JOB_RUN, 517)]
        header = lambda: str(app.query_one(RunHeader).visual)  # noqa: E731
        await wait_for_screen(pilot, lambda: "◎ rank 517" in header(), what="the rank in the header")
        chart = lambda: app.query_one(PlotextPlot).render().plain  # noqa: E731
        await wait_for_screen(pilot, lambda: "loss of rank 517  last 7.59" in chart(), what="rank 517's loss")
        await pilot.press("escape")  # back to all ranks: the lowest one's series again
        await wait_for_screen(pilot, lambda: "loss  last 1.09" in chart(), what="rank 0's loss")
        assert app.dashboard.focus_rank is None and "◎" not in header()


async def test_escape_and_j_go_back_and_the_job_view_opens_by_itself_only_once() -> None:
    async with job_app(job_store(big_job())) as (app, pilot):
        await pilot.press("m", "right")
        await pilot.press("enter")
        await wait_for_screen(pilot, lambda: isinstance(app.screen, NodeScreen), what="the node view")
        await pilot.press("escape")
        await wait_for_screen(pilot, lambda: isinstance(app.screen, JobScreen), what="the grid again")
        await pilot.press("escape")
        await wait_for_screen(pilot, lambda: app.screen is app.dashboard, what="the dashboard")
        footer = {key for key, b in app.screen.active_bindings.items() if b.binding.show}
        assert "j" in footer and "escape" not in footer, "j offered; no rank to unfocus"
        await pilot.pause(1.0)
        assert app.screen is app.dashboard, "not opened again by itself"
        await pilot.press("j")
        await wait_for_screen(pilot, lambda: isinstance(app.screen, JobScreen), what="j: the job view")
        grid = app.screen.query_one(JobGrid)
        assert grid.cursor == 1 and grid.metric.key == "mem", "cursor and figure kept"
        await pilot.press("j")
        await wait_for_screen(pilot, lambda: app.screen is app.dashboard, what="j: the dashboard")
        await pilot.press("question_mark")
        help_text = statics_text(app.screen)
        assert isinstance(app.screen, HelpScreen) and "Job view" in help_text and "▲ ❚ ✖" in help_text


async def test_the_cursor_brackets_its_node_and_moves_by_rows() -> None:
    async with job_app(job_store(big_job())) as (app, pilot):
        await pilot.press(*["right"] * 15)
        await wait_for_screen(pilot, lambda: grid_rows(app)[0].rstrip().endswith("]"), what="node 15")
        rows = grid_rows(app)
        assert rows[0].count("[") == 1 and "]" not in rows[16] and rows[0].startswith("▶")
        await pilot.press("right")  # node 16: the first of the next row
        await wait_for_screen(pilot, lambda: grid_rows(app)[16].startswith("▶"), what="node 16")
        rows = grid_rows(app)
        assert "[" not in rows[0] and "]" not in rows[0] and rows[16].count("[") == 1
        await pilot.press("down", "end", "up")
        grid = app.screen.query_one(JobGrid)
        assert grid.cursor == 495
        await wait_for_screen(pilot, lambda: grid_rows(app)[480].startswith("▶"), what="the row marked")
        await pilot.press("home")
        assert grid.cursor == 0


async def test_the_band_chart_shows_the_loss_across_ranks() -> None:
    async with job_app(job_store(big_job())) as (app, pilot):
        band = app.screen.query_one(LossBand)
        await wait_for_screen(pilot, lambda: "median" in str(band.border_title), what="the band drawn")
        assert "median 0.7742 (line)" in str(band.border_title)
        assert "█" in band.render().plain, "the band is a filled area"


async def test_the_job_view_redraws_only_when_summaries_or_findings_change() -> None:
    store = job_store(without_findings(big_job()))
    async with job_app(store) as (app, pilot):
        grid = app.screen.query_one(JobGrid)
        await pilot.pause(1.0)
        refreshes = []
        original_refresh = grid.refresh
        grid.refresh = lambda *a, **k: (refreshes.append(1), original_refresh(*a, **k))[1]  # type: ignore[method-assign]
        await pilot.pause(1.5)  # three ticks, nothing new: at most a look at the (unchanged) marks
        assert not refreshes
        store.deliver(Batch(job_batches(nodes=1, steps=1)[0]))  # node000 summarised again
        await wait_for_screen(pilot, lambda: refreshes, what="a redraw for the new summary")


# ------------------------------------------------------------------------- the parts alone


def test_layout_fits_4096_gpus_in_160x48_and_degrades_to_nodes_in_80x24() -> None:
    names = [f"node{n:03d}" for n in range(512)]
    wide = choose_layout(512, 8, names, width=158, height=32)
    assert (wide.mode, wide.per_row, wide.rows) == ("gpus", 16, 32)
    narrow = choose_layout(512, 8, names, width=78, height=10)
    assert (narrow.mode, narrow.per_row, narrow.rows) == ("nodes", 64, 8)
    small = choose_layout(2, 4, ["nodeA", "nodeB"], width=158, height=32)
    assert (small.mode, small.cell_width, small.per_row) == ("named", 3, 1), "a list of named nodes"
    some = choose_layout(100, 8, names[:100], width=158, height=32)
    assert (some.mode, some.per_row, some.rows) == ("named", 4, 25), "as few a row as fit the height"


def test_band_columns_keep_the_extremes_and_fill_the_gaps() -> None:
    steps = list(range(1000))
    low, high = [1.0] * 1000, [2.0] * 1000
    low[500], high[700] = 0.1, 9.0
    columns = band_columns(steps, low, high, 50)
    assert len(columns) == 50 and min(c[1] for c in columns) == 0.1 and max(c[2] for c in columns) == 9.0
    sparse = band_columns([0, 10], [1.0, 3.0], [2.0, 4.0], 10)
    assert [round(c[1], 1) for c in sparse] == [1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4, 2.6, 2.8]
    assert band_columns([0, 1], [math.nan, math.nan], [1.0, 1.0], 4) == []


def test_problems_are_current_while_the_relay_repeats_them_and_a_lost_relay_marks_its_node() -> None:
    def event(event_id: str, kind: str, ts: float, **details: Any) -> EventRecord:
        return EventRecord(event_id, 0, 5, "critical", kind, kind, details, 1, ts, ts)

    now = 1000.0
    problems = job_problems(
        [
            event("a", "straggler", now - CURRENT_S - 1, rank=3, host="n0"),
            event("b", "hang", now - 1, rank=3, host="n0"),
            event("c", "rank_lost", now, relay="node@n1", host="n1"),
            event("d", "loss_spike", now),
        ],
        now,
    )
    assert [(p.id, p.current, p.rank) for p in problems] == [
        ("c", True, None), ("b", True, 3), ("a", False, 3)
    ], "newest first; the straggler is over; a lost relay is about no rank"
    marks = current_marks(problems)
    assert marks.by_rank == {3: "hang"} and marks.by_node == {"n1": "rank_lost"}
