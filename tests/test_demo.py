"""The demo training as a real subprocess: what its recording shows, and how it stops."""

from __future__ import annotations

import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from publisher.wire.protocol import decode, read_number

#: Speed events the machine's own load can raise in any run (docs/detectors.md, "throughput_drop").
MACHINE_SPEED_KINDS = frozenset({"throughput_drop", "step_time_outlier", "data_bottleneck"})


@pytest.fixture
def demo_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "TUIMON_RUNTIME_DIR": str(tmp_path / "runtime"), "PYTHONUNBUFFERED": "1"}


def read_recording(path: Path) -> list[dict]:
    return [decode(line) for line in path.read_bytes().splitlines()]


def test_the_demo_trains_for_real_and_walks_through_its_incidents(
    tmp_path: Path, demo_env: dict[str, str]
) -> None:
    record = tmp_path / "demo.jsonl"
    command = [sys.executable, "-m", "publisher.demo", "--fast", "--steps", "2400", "--step-delay", "0.002"]
    done = subprocess.run(
        [*command, "--record", str(record), "--run", "demo-test"],
        capture_output=True,
        text=True,
        timeout=120,
        env=demo_env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "", "the viewer owns the terminal: the demo prints nothing"
    messages = read_recording(record)

    start = messages[0]
    assert (start["type"], start["run"], start["gpu_source"]) == ("run_start", "demo-test", "simulated")
    assert start["config"]["demo"] is True and start["seed"] == 0

    metrics = [m for m in messages if m["type"] == "metrics"]
    assert [m["step"] for m in metrics] == list(range(1, 2401))
    losses = [read_number(m["metrics"]["loss"]) for m in metrics]
    # Medians of the finite losses: the script comes round again, so the last steps may hold a
    # spike and a NaN (and one NaN makes a sort, so a median, return any element: a spike's 27).
    first, late = losses[:20], [loss for loss in losses[-300:] if math.isfinite(loss)]
    assert statistics.median(late) < 0.5 * statistics.median(first), "the loss really decreases"
    assert all(m["metrics"]["data_time"] >= 0 for m in metrics)
    # Charted all along: on a CPU its 0.5 % cost budget spaces it out (every ~10 steps here).
    assert sum("grad_norm" in m["metrics"] for m in metrics) > len(metrics) / 40

    gpu = [m for m in messages if m["type"] == "gpu"]
    assert len(gpu) > 20 and all(m["simulated"] is True and len(m["devices"]) == 4 for m in gpu)
    assert all("Simulated GPU" in d["name"] for m in gpu for d in m["devices"])

    events = [m for m in messages if m["type"] == "event"]
    first_of_kind = {}
    for event in events:
        # What the machine does to the run's speed is no incident of the demo's script: a loaded CI
        # machine (another job's processes) can slow a run of 2 ms steps for real, and say so.
        if event["kind"] not in MACHINE_SPEED_KINDS:
            first_of_kind.setdefault(event["kind"], event)
    assert list(first_of_kind) == ["loss_spike", "nonfinite_loss", "gpu_imbalance", "gpu_throttle"]
    nan_step = first_of_kind["nonfinite_loss"]["step"]
    assert math.isnan(losses[nan_step - 1]), "the event points at the step whose loss was NaN"
    assert first_of_kind["nonfinite_loss"]["severity"] == "critical"
    assert first_of_kind["gpu_imbalance"]["details"]["index"] == 2
    assert first_of_kind["gpu_throttle"]["details"]["index"] == 1
    assert first_of_kind["gpu_throttle"]["details"]["reasons"] == ["hw_thermal"]
    assert all(e["details"].get("simulated") is True for e in events if e["kind"].startswith("gpu_"))
    assert not any("simulated" in e["details"] for e in events if not e["kind"].startswith("gpu_"))
    end = messages[-1]
    assert (end["type"], end["status"], end["step"]) == ("run_end", "completed", 2400)


def test_sigterm_ends_the_demo_cleanly_as_interrupted(tmp_path: Path, demo_env: dict[str, str]) -> None:
    record = tmp_path / "stopped.jsonl"
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "publisher.demo",
            "--steps",
            "0",
            "--step-delay",
            "0.01",
            "--record",
            str(record),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=demo_env,
    )
    try:
        deadline = time.monotonic() + 60
        while not (record.exists() and b'"type":"metrics"' in record.read_bytes()):
            assert demo.poll() is None, demo.stderr.read() if demo.stderr else ""
            assert time.monotonic() < deadline, "the demo never published a step"
            time.sleep(0.1)
        demo.send_signal(signal.SIGTERM)
        stdout, stderr = demo.communicate(timeout=30)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 0, stderr
    assert stdout == "" and stderr == ""
    end = read_recording(record)[-1]
    assert (end["type"], end["status"]) == ("run_end", "interrupted")
    assert not any((tmp_path / "runtime").iterdir()), "the registry entry is removed on exit"
