"""The layer panel: per-layer samples of real CPU trainings as a heatmap, the worst layers named,
one layer's history, and the layers an event names highlighted when it is opened.

The trainings are the fault suite's own scripts, run as subprocesses that record their stream (a
real Monitor, real hooks); the recordings are replayed into the real app driven by its Pilot.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.recordings import write_recording
from helpers.runs import synthetic_run
from helpers.waiting import wait_for_screen
from textual.pilot import Pilot

from tuimon.sources.replay import ReplaySource
from tuimon.store.layers import LayerHistory, named_layers
from tuimon.ui.app import TuimonApp
from tuimon.ui.dashboard.events import EventLog
from tuimon.ui.event_detail import EventDetailScreen
from tuimon.ui.layers.heatmap import LayerHeatmap
from tuimon.ui.layers.history import LayerHistoryChart
from tuimon.ui.layers.screen import LayerScreen

FAULTS = Path(__file__).resolve().parent / "faults"


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two real faulty trainings: dying ReLUs at step 31, and vanishing gradients from the start."""
    out = tmp_path_factory.mktemp("layer-runs")
    found = {}
    for name in ("fault_dead_relu", "fault_vanishing_gradients"):
        done = subprocess.run([sys.executable, str(FAULTS / f"{name}.py"), "--record-dir", str(out)],
                              cwd=FAULTS, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        found[name] = out / f"{name}.0.0.jsonl"
    return found


def sample(grad_norms: dict[str, float], shapes: dict[str, list[int]] | None = None) -> dict[str, object]:
    names = list(grad_norms)
    return {"params": {"name": names, "grad_norm": list(grad_norms.values()),
                       "shape": [(shapes or {}).get(n, [4]) for n in names]}}


# ------------------------------------------------------------------------------------ judging


def test_a_layer_far_below_the_others_is_the_worst_and_a_bias_is_not_judged_by_its_size() -> None:
    history = LayerHistory()
    shapes = {"0.weight": [256, 256], "0.bias": [256], "1.weight": [256, 256], "2.weight": [256, 256]}
    # Per element the bias is as large as the weights (norm / sqrt(size)): 0.05/16 vs 0.8/256.
    history.add(1, sample({"0.weight": 1e-6, "0.bias": 0.05, "1.weight": 0.8, "2.weight": 0.8}, shapes))
    matrix = history.matrix("grad_norm")
    assert matrix.layers == ("0.weight", "0.bias", "1.weight", "2.weight"), "model order kept"
    worst = matrix.worst(8)
    assert [layer for layer, _, _ in worst] == ["0.weight"]
    assert worst[0][2] == 1.0, "five decades below the median layer is as bad as the scale goes"


def test_malformed_columns_are_skipped_and_a_nan_is_marked_bad() -> None:
    history = LayerHistory()
    assert not history.add(1, {"params": "junk", "modules": {"name": [1, None]}})
    assert history.add(2, {"params": {"name": ["a", "b", 3], "grad_norm": [1.0, "nan", "NaN"]},
                           "modules": {"name": ["m"], "nan": [0], "inf": [2]}})
    nonfinite = history.matrix("nonfinite")
    assert dict(zip(nonfinite.layers, (row[0] for row in nonfinite.badness), strict=True)) == {
        "m": 1.0, "a": 0.0, "b": 1.0}, "a junk number leaves its row out, alone"


def test_events_name_their_layers_in_the_order_they_give() -> None:
    known = ["0.weight", "1", "2.weight", "3"]
    assert named_layers({"modules": {"3": {}, "1": {}}, "params": ["x"]}, known) == ["3", "1"]
    assert named_layers({"first_layer": "0.weight", "per_layer_rms": {"2.weight": 1}}, known) == ["0.weight"]
    assert named_layers({"params": 5}, known) == []


# --------------------------------------------------------------------------------------- the app


async def played(app: TuimonApp, pilot: Pilot) -> None:
    def ended() -> bool:
        run = app.dashboard.run_name
        view = app.store.run_view(run) if run is not None else None
        return view is not None and view.health == "ended"

    await wait_for_screen(pilot, ended, what="the end")
    await pilot.pause(0.3)


async def select_event(app: TuimonApp, pilot: Pilot, kind: str) -> None:
    await pilot.press("e")
    log = app.query_one(EventLog)
    for row in range(log.row_count):
        log.move_cursor(row=row)
        await pilot.pause(0.02)
        if (event := app.dashboard.selected_event()) is not None and event.kind == kind:
            return
    raise AssertionError(f"no {kind} event in the log")


def heatmap_text(app: TuimonApp) -> str:
    return app.screen.query_one(LayerHeatmap).render().plain


@pytest.mark.parametrize("size", [(160, 48), (80, 24)], ids=["160x48", "80x24"])
async def test_dead_relus_event_opens_the_heatmap_on_its_layers(recordings: dict[str, Path],
                                                                size: tuple[int, int]) -> None:
    app = TuimonApp(ReplaySource([recordings["fault_dead_relu"]], speed=math.inf))
    async with app.run_test(size=size) as pilot:
        await played(app, pilot)
        await select_event(app, pilot, "dead_activations")
        await pilot.press("enter")
        detail = app.screen
        assert isinstance(detail, EventDetailScreen)
        assert detail.event_layers == ("1", "3"), "the ReLUs the detector named, that the samples hold"
        assert "h: in the layer heatmap" in detail.query_one("#event-detail").render().plain
        await pilot.press("h")
        await wait_for_screen(pilot, lambda: isinstance(app.screen, LayerScreen), what="the layer panel")
        screen = app.screen
        assert isinstance(screen, LayerScreen) and screen.statistic == "dead_frac"
        heatmap = screen.query_one(LayerHeatmap)
        assert heatmap.cursor_layer == "1", "the cursor on the first layer the event names"
        lines = heatmap_text(app).splitlines()
        assert any(line.startswith("!3") for line in lines), "the other named layer is marked"
        assert any(line.startswith("▶1") for line in lines)
        worst = screen.query_one("#layers-worst").render().plain
        assert worst.index(" 3 ") < worst.index(" 1 ") and " 0 " not in worst, "the dead ones, worst first"
        # The layer's history: dead fraction rising to all its units after the burst.
        await pilot.press("enter")
        chart = screen.query_one(LayerHistoryChart)
        await wait_for_screen(pilot, lambda: chart.display and str(chart.border_title).startswith(
            "1: dead fraction"), what="the history")
        steps, values = app.store.layer_matrix(app.dashboard.run_name or "", "dead_frac").history("1")
        assert max(values) > 0.8 and values[0] < 0.5 and steps == sorted(steps)
        await pilot.press("m")
        assert screen.statistic == "nonfinite" and "NaN/Inf" in str(heatmap.border_title)
        await pilot.press("escape")
        assert not isinstance(app.screen, LayerScreen)


async def test_vanishing_gradients_from_the_dashboard_key(recordings: dict[str, Path]) -> None:
    """``h`` on the dashboard with the event selected: the gradient norms, the first layer named."""
    app = TuimonApp(ReplaySource([recordings["fault_vanishing_gradients"]], speed=math.inf))
    async with app.run_test(size=(160, 48)) as pilot:
        await played(app, pilot)
        await select_event(app, pilot, "vanishing_gradient")
        await pilot.press("h")
        await wait_for_screen(pilot, lambda: isinstance(app.screen, LayerScreen), what="the layer panel")
        screen = app.screen
        assert isinstance(screen, LayerScreen)
        assert screen.statistic == "grad_norm" and screen.named == ("0.weight",)
        matrix = screen.query_one(LayerHeatmap).matrix
        assert matrix is not None
        worst = [layer for layer, _, _ in matrix.worst(3)]
        assert worst[0] in {"0.weight", "0.bias", "2.weight"}, "the first layers are the vanishing ones"
        await pilot.press("end", "w")
        assert screen.query_one(LayerHeatmap).cursor_layer == worst[0], "w: the cursor to the worst layer"


async def test_a_run_without_layer_samples_says_so(tmp_path: Path) -> None:
    recording = write_recording(tmp_path / "run.jsonl", synthetic_run(steps=20))
    app = TuimonApp(ReplaySource([recording], speed=math.inf))
    async with app.run_test(size=(120, 40)) as pilot:
        await played(app, pilot)
        await pilot.press("h")
        assert isinstance(app.screen, LayerScreen)
        assert "no layer samples yet" in heatmap_text(app)
