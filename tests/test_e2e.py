"""End to end: a real CPU training in its own process, found through the registry, on the real app."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.cli import Terminal
from helpers.waiting import wait_for_screen
from textual_plotext import PlotextPlot

from tuimon.sources.live import LiveSource
from tuimon.sources.replay import load_recordings
from tuimon.ui.app import TuimonApp
from tuimon.ui.dashboard.events import EventLog
from tuimon.ui.dashboard.gpu import GpuCard


@pytest.fixture
def training(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """``python -m publisher.demo`` (real PyTorch training, 4 simulated GPUs, scripted incidents)
    registering in a private runtime folder."""
    runtime = tmp_path / "runtime"
    log = (tmp_path / "demo.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "publisher.demo",
            "--fast",
            "--step-delay",
            "0.02",
            "--record",
            str(tmp_path / "demo.jsonl"),
        ],
        env={**os.environ, "TUIMON_RUNTIME_DIR": str(runtime)},
        stdout=log,
        stderr=log,
    )
    yield runtime, process
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    log.close()
    assert process.returncode == 0, (tmp_path / "demo.log").read_text()


def shown_step(app: TuimonApp) -> int:
    header = str(app.query_one("#header").visual)
    value = header.split("step ")[1].split()[0].replace(",", "") if "step " in header else ""
    return int(value) if value.isdigit() else -1


async def test_a_real_training_on_the_dashboard(training: tuple[Path, subprocess.Popen[bytes]]) -> None:
    runtime, process = training
    runtime.mkdir(mode=0o700, exist_ok=True)
    app = TuimonApp(LiveSource(registry_dir=runtime))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for_screen(
            pilot, lambda: shown_step(app) > 0, timeout_s=60, what="the training's first steps"
        )
        header = str(app.query_one("#header").visual)
        assert "demo" in header and "● LIVE" in header and "SIMULATED GPUs" in header
        first = shown_step(app)
        await wait_for_screen(
            pilot, lambda: shown_step(app) >= first + 20, timeout_s=30, what="steps advancing"
        )
        await wait_for_screen(pilot, lambda: len(app.query(GpuCard)) == 4, timeout_s=30, what="4 GPUs")
        assert app.query_one("#gpus").border_title == "GPUs  SIMULATED"
        await wait_for_screen(
            pilot,
            lambda: "loss  last" in app.query_one(PlotextPlot).render().plain,
            timeout_s=30,
            what="the loss chart",
        )
        events = app.query_one(EventLog)
        await wait_for_screen(
            pilot, lambda: events.row_count > 0, timeout_s=90, what="an event from training"
        )
        kinds = {str(events.get_cell(key.value, "kind")) for key in events.rows}
        assert kinds & {"loss_spike", "nonfinite_loss", "gpu_imbalance", "gpu_throttle"}
        assert "malformed 0" in str(app.query_one("#status").visual)
        assert process.poll() is None


def test_demo_command_watches_records_and_says_how_to_replay(tmp_path: Path) -> None:
    record = tmp_path / "demo.jsonl"
    terminal = Terminal(["demo", "--steps", "40", "--record", str(record)], {}, controlling=True)
    try:
        terminal.read_until(b"ENDED", timeout_s=90)  # the training ran and finished on screen
        os.write(terminal.master, b"q")
        terminal.read_until(f" replay {record}".encode(), timeout_s=30)
        assert terminal.process.wait(20) == 0
    finally:
        terminal.kill()
    assert f"recording: {record}".encode() in terminal.output
    (hint,) = [line for line in terminal.output.decode().splitlines() if line.startswith("replay it with: ")]
    command = shlex.split(hint.removeprefix("replay it with: "))
    assert command[-2:] == ["replay", str(record)]
    runs = subprocess.run([*command[:-1], "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert runs.returncode == 0 and "recording" in runs.stdout, "the printed command runs in a new shell"
    recording = load_recordings([record])
    assert b'"type":"run_end"' in recording.lines[-1] and len(recording.lines) > 40


def test_demo_training_that_fails_is_reported_on_screen_and_after(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    terminal = Terminal(["demo", "--record", str(blocker / "demo.jsonl")], {}, controlling=True)
    try:
        terminal.read_until(b"the demo training exited with code 1", timeout_s=60)
        os.write(terminal.master, b"q")
        terminal.read_until(b"cannot record to", timeout_s=30)  # its log, printed after the screen closed
        assert terminal.process.wait(20) == 1
    finally:
        terminal.kill()
