"""Nothing lost: a part of the Monitor that fails costs its own figures only, never the step.

Real training loops on the CPU, an embedded Monitor recording to a file, and an unmodified script
under `tuimon run`. What a user would notice: every optimizer step's metrics are in the recording,
each NaN loss is named, a part that failed is named in its steps (``failed``) and told once as a
``telemetry_error`` event, and one that fails on every step is switched off with a warning.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.cli import SCRIPTS, tuimon_run_command
from helpers.recordings import of_type, read_messages, wait_until_recorded
from helpers.waiting import wait_for_screen

from publisher.detectors import Detector, Finding
from publisher.monitor import Monitor
from publisher.telemetry_errors import OFF_AFTER
from publisher.wire.protocol import ProtocolError, read_number
from publisher.wire.validation import check_message
from tuimon.sources.replay import ReplaySource
from tuimon.ui.app import TuimonApp


def _masked_loop(mon: Monitor, steps: int, batch: int = 6) -> list[int]:
    """The masked-loss classifier of ``tests/scripts/plain_masked_loss.py``, embedded; its NaN steps."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    mon.add_optimizer(optimizer)
    rows = steps * batch
    inputs, labels = torch.randn(rows, 8), torch.randint(0, 4, (rows,))
    labelled = torch.rand(rows) < 0.5
    nan_steps = []
    for step in range(1, steps + 1):
        part = slice((step - 1) * batch, step * batch)
        mask = labelled[part]
        loss = F.cross_entropy(model(inputs[part])[mask], labels[part][mask])
        if torch.isnan(loss):
            nan_steps.append(step)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mon.step(loss)
    return nan_steps


def _named_nan_steps(messages: list[dict[str, Any]]) -> set[int]:
    """The steps the ``nonfinite_loss`` events cover: each episode from its first step to its latest
    (an event updated while the loss stays NaN, or comes back NaN soon after)."""
    events = [e for e in of_type(messages, "event") if e["kind"] == "nonfinite_loss"]
    return {step for e in events for step in range(e["step"], e["details"].get("last_step", e["step"]) + 1)}


def _nan_metric_steps(messages: list[dict[str, Any]]) -> list[int]:
    return [m["step"] for m in of_type(messages, "metrics")
            if "loss" in m["metrics"] and math.isnan(read_number(m["metrics"]["loss"]))]


def test_a_masked_loss_over_an_empty_selection_keeps_every_step_and_names_each_nan(tmp_path: Path) -> None:
    record = tmp_path / "masked.jsonl"
    mon = Monitor(run="masked", record=record, gpu="none")
    nan_steps = _masked_loop(mon, 400)
    mon.close()
    messages = read_messages(record)
    assert len(nan_steps) >= 3  # the loop does have batches without a labelled row
    assert [m["step"] for m in of_type(messages, "metrics")] == list(range(1, 401))
    assert _nan_metric_steps(messages) == nan_steps
    assert set(nan_steps) <= _named_nan_steps(messages)
    events = of_type(messages, "event")
    assert not [e for e in events if e["kind"] == "telemetry_error"], "an empty selection is no failure"


def test_a_masked_loss_under_tuimon_run_keeps_every_step_and_names_each_nan(tmp_path: Path) -> None:
    result, recordings = tuimon_run_command(tmp_path, [sys.executable, str(SCRIPTS / "plain_masked_loss.py")],
                                            "masked")
    assert result.returncode == 0, result.stderr[-2000:]
    nan_steps = [int(n) for n in result.stdout.split("nan steps:")[1].strip().split(",") if n]
    messages = read_messages(recordings[0])
    assert [m["step"] for m in of_type(messages, "metrics")] == list(range(1, 401))
    assert _nan_metric_steps(messages) == nan_steps
    assert set(nan_steps) <= _named_nan_steps(messages)
    assert "failed" not in result.stderr


def test_odd_losses_are_values_and_an_unreadable_one_costs_only_the_loss(tmp_path: Path) -> None:
    """A Python float, a NumPy scalar, a tensor without a graph, an integer and a bool tensor are
    losses; a complex one and a vector are not: that step goes out without a loss, named failed."""
    record = tmp_path / "odd.jsonl"
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = Monitor(model, optimizer, run="odd", record=record, gpu="none")
    losses: list[Any] = [0.5, np.float32(0.25), torch.tensor(0.75), torch.tensor(3), torch.tensor(True),
                         torch.tensor(1 + 2j), torch.ones(3), None, np.float64(0.125)]
    for loss in losses:
        out = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        out.backward()
        optimizer.step()
        mon.step(loss)
    mon.close()
    metrics = {m["step"]: m for m in of_type(read_messages(record), "metrics")}
    assert sorted(metrics) == list(range(1, len(losses) + 1))
    read = {step: read_number(m["metrics"]["loss"]) if "loss" in m["metrics"] else None
            for step, m in metrics.items()}
    assert read == {1: 0.5, 2: 0.25, 3: 0.75, 4: 3.0, 5: 1.0, 6: None, 7: None, 8: None, 9: 0.125}
    assert metrics[6]["failed"] == ["loss"] and metrics[7]["failed"] == ["loss"]
    assert all("lr" in m["metrics"] and "step_time" in m["metrics"]
               for step, m in metrics.items() if step > 1)
    told = [e for e in of_type(read_messages(record), "event") if e["kind"] == "telemetry_error"]
    assert [(e["severity"], e["details"]["part"], e["step"]) for e in told] == [("info", "loss", 6)]
    assert "complex" in told[0]["details"]["error"]


def test_an_extra_failing_on_every_step_is_told_once_then_switched_off_with_a_warning(tmp_path: Path) -> None:
    record = tmp_path / "extra.jsonl"
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = Monitor(model, optimizer, run="extra", record=record, gpu="none")
    steps = OFF_AFTER + 10
    for _ in range(steps):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mon.step(loss, phase=torch.tensor(1j), accuracy=0.5)  # a complex "metric" of the user's
    mon.close()
    messages = read_messages(record)
    metrics = of_type(messages, "metrics")
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    assert all(m["metrics"]["accuracy"] == 0.5 and "loss" in m["metrics"] for m in metrics)
    failing = [m["step"] for m in metrics if m.get("failed") == ["metric 'phase'"]]
    assert failing == list(range(1, OFF_AFTER + 1))  # then off: not tried, not named
    told = [(e["severity"], e["step"], e["details"]["switched_off"]) for e in of_type(messages, "event")
            if e["kind"] == "telemetry_error"]
    assert told == [("info", 1, False), ("warning", OFF_AFTER, True)]
    assert mon.telemetry_errors == OFF_AFTER


class _BrokenOnOddSteps(Detector):
    """A user's detector with a bug: it raises on odd steps, and finds a "spike" on the others."""

    def observe_step(self, step: int, metrics: dict[str, float]) -> list[Finding]:
        if step % 2:
            raise KeyError("grad_norm_smooth")
        return [Finding("loss_spike", f"a spike at step {step}")] if step == 10 else []


def test_a_detector_that_raises_loses_only_its_own_observations(tmp_path: Path) -> None:
    record = tmp_path / "detector.jsonl"
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = Monitor(model, optimizer, run="detector", record=record, gpu="none",
                  detectors=[_BrokenOnOddSteps()])
    for step in range(1, 31):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        if step == 25:
            loss = loss * math.nan
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mon.step(loss)
    mon.close()
    messages = read_messages(record)
    assert [m["step"] for m in of_type(messages, "metrics")] == list(range(1, 31))
    events = of_type(messages, "event")
    kinds = [(e["kind"], e["step"]) for e in events]
    assert ("loss_spike", 10) in kinds  # its even steps still count
    told = [e for e in events if e["kind"] == "telemetry_error"]
    assert [(e["details"]["part"], e["step"], e["severity"]) for e in told] == [
        ("detector _BrokenOnOddSteps", 1, "info")]
    assert "grad_norm_smooth" in told[0]["message"]


def test_a_failed_field_is_checked_by_the_protocol() -> None:
    base = {"v": 1, "type": "metrics", "run": "r", "rank": 0, "host": "h", "seq": 1, "ts": 1.0, "step": 1,
            "metrics": {"loss": 1.0}}
    check_message({**base, "failed": ["loss look"]})
    for bad in ("loss look", [1], ["x" * 300]):
        with pytest.raises(ProtocolError, match="failed"):
            check_message({**base, "failed": bad})


def _failing_extra_run(record: Path, steps: int = 3, close: bool = True) -> Monitor:
    """A small loop whose caller passes a complex "metric" on every step: one failing part."""
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = Monitor(model, optimizer, run="told", record=record, gpu="none")
    for _ in range(steps):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mon.step(loss, phase=torch.tensor(1j))
    if close:
        mon.close()
    return mon


def test_tuimon_tail_shows_the_telemetry_error_of_a_live_run(tmp_path: Path) -> None:
    record = tmp_path / "told.jsonl"
    mon = _failing_extra_run(record, close=False)
    try:
        wait_until_recorded(record, 3)
        shown = subprocess.run([sys.executable, "-m", "tuimon.cli", "tail", mon.endpoint, "--for", "3"],
                               capture_output=True, text=True, timeout=60, check=False)
    finally:
        mon.close()
    told = [line for line in shown.stdout.splitlines() if '"telemetry_error"' in line]
    assert len(told) == 1 and "metric 'phase'" in told[0], shown.stdout[-2000:]


async def test_the_dashboard_header_counts_the_parts_that_failed(tmp_path: Path) -> None:
    record = tmp_path / "told.jsonl"
    _failing_extra_run(record, steps=OFF_AFTER + 2)  # told twice: failed, then switched off
    app = TuimonApp(ReplaySource([record], speed=math.inf))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for_screen(pilot, lambda: "ENDED" in str(app.query_one("#header").visual), what="the end")
        assert "⚙ 1 part failed" in str(app.query_one("#header").visual)
