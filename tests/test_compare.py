"""Two runs compared: ``tuimon diff`` on recordings of real CPU trainings (and a live one), and
``--baseline`` in the real app: the baseline's band drawn, and an event when a run leaves it."""

from __future__ import annotations

import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers.cli import SCRIPTS, TUIMON
from helpers.peers import RawPublisher
from helpers.recordings import of_type, read_messages, write_recording
from helpers.runs import RunBuilder
from helpers.waiting import wait_for_screen, wait_until
from textual_plotext import PlotextPlot

from tuimon.cli import main
from tuimon.compare.band import KIND, BaselineWatch, load_baseline
from tuimon.compare.record import RunRecord
from tuimon.compare.sources import load_run
from tuimon.sources.replay import ReplaySource
from tuimon.ui.app import TuimonApp
from tuimon.ui.dashboard.events import EventLog

#: The training every run here is of: short, so that the three recordings take seconds.
STEPS = "150"
BASE = ("--lr", "0.02", "--seed", "0")
OTHER = ("--lr", "0.1", "--seed", "1")


def train(folder: Path, name: str, *args: str, options: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    """``tuimon run --record`` the seeded script, as a user would, in a private run registry
    (``options``: more of ``tuimon run``'s own)."""
    env = {**os.environ, "TUIMON_RUNTIME_DIR": str(folder / "runtime")}
    command = [*TUIMON, "run", "--run", name, "--record", str(folder / name), "--gpu", "none", *options, "--",
               sys.executable, str(SCRIPTS / "plain_seeded_train.py"), *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Recordings of three runs, trained side by side: ``base``, ``same`` (its settings and seed),
    ``other`` (another learning rate and seed, and ``--on-nonfinite skip``)."""
    folder = tmp_path_factory.mktemp("runs")
    settings = {"base": BASE, "same": BASE, "other": OTHER}
    trainings = [train(folder, name, "--steps", STEPS, *options,
                       options=("--on-nonfinite", "skip") if name == "other" else ())
                 for name, options in settings.items()]
    for training in trainings:
        _, stderr = training.communicate(timeout=300)
        assert training.returncode == 0, stderr
    return folder


@dataclass
class Said:
    """What ``tuimon diff`` said and its exit status."""

    returncode: int
    stdout: str
    stderr: str


def diff(capsys: pytest.CaptureFixture[str], *args: str) -> Said:
    """``tuimon diff ARGS``, through the command line's own entry point."""
    code = main(["diff", *args])
    out, err = capsys.readouterr()
    return Said(code, out, err)


def losses(folder: Path, name: str) -> dict[int, float]:
    [path] = folder.glob(f"{name}.rank0.*.jsonl")
    return {m["step"]: float(m["metrics"]["loss"]) for m in of_type(read_messages(path), "metrics")}


def test_diff_names_the_learning_rate_and_the_seed_and_where_the_losses_part(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = diff(capsys, str(runs / "base"), str(runs / "other"))
    assert result.returncode == 1, result.stderr
    text = result.stdout
    assert re.search(r"--lr +0\.02 +→ 0\.1\n", text) and "--seed" in text
    assert re.search(r"seed +0 +→ 1\n", text)
    assert re.search(r"monitoring +on_nonfinite +report +→ skip\n", text)

    report = json.loads(diff(capsys, str(runs / "base"), str(runs / "other"), "--json").stdout)
    named = {(d["section"], d["name"]): (d["a"], d["b"]) for d in report["differences"]}
    assert named[("command", "--lr")] == ("0.02", "0.1")
    assert named[("command", "--seed")] == ("0", "1")
    assert named[("seeds", "seed")] == (0, 1)
    assert named[("monitoring", "on_nonfinite")] == ("report", "skip"), "tuimon's own options too"
    assert not any(section == "command" and name != "--lr" and name != "--seed" for section, name in named)
    assert report["curves"]["lr"]["parted"]["step"] == 1, "the learning rate differs from the first step"
    step = report["curves"]["loss"]["parted"]["step"]
    assert f"loss           parts at step {step}:" in text
    # Where it says they part, the runs are apart from then on: the higher learning rate learns
    # faster, over the following steps and to the end.
    base, other = losses(runs, "base"), losses(runs, "other")
    after = [base[s] - other[s] for s in range(step, step + 20)]
    before = [base[s] - other[s] for s in range(1, 4)]
    assert statistics.median(after) > 0.1 and abs(statistics.median(before)) < statistics.median(after)
    assert report["differs"] is True and any("loss parts" in phrase for phrase in report["counted"])


def test_two_runs_with_the_same_settings_and_seed_differ_in_nothing_beyond_noise(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = diff(capsys, str(runs / "base"), str(runs / "same"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.rstrip().endswith("nothing differs beyond noise")
    report = json.loads(diff(capsys, str(runs / "base"), str(runs / "same"), "--json").stdout)
    assert report["differences"] == [] and report["differs"] is False
    assert report["curves"]["loss"] == {"compared_steps": int(STEPS), "parted": None, "rejoined": None}
    assert "process ids" in report["ignored"], "what is left out is said"


def test_a_live_run_is_compared_by_its_name_in_the_registry(
    runs: Path, tmp_path: Path, private_runtime_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    live = train(tmp_path, "live", "--steps", "100000", "--step-delay", "0.02", *BASE)
    try:
        assert private_runtime_dir == tmp_path / "runtime", "the run registers where this test's viewer looks"
        wait_until(lambda: any(private_runtime_dir.glob("live.*.json")), 90, "the live run registered")
        # Listening ends once the run's snapshot has come; the long limit is for a loaded machine.
        result = diff(capsys, str(runs / "base"), "live", "--json", "--listen", "30")
    finally:
        # SIGTERM, which `tuimon run` forwards: a SIGKILL would leave its training running, orphaned.
        live.terminate()
        live.wait(timeout=60)
    report = json.loads(result.stdout)
    assert report["b"]["run"] == "live" and report["b"]["end"] is None
    assert any(note.startswith("B has not ended") for note in report["notes"])
    commands = {d["name"] for d in report["differences"] if d["section"] == "command"}
    assert commands == {"--steps", "--step-delay"}
    assert report["curves"]["loss"]["compared_steps"] > 0 and report["curves"]["loss"]["parted"] is None


def test_a_live_run_heard_from_its_start_is_caught_up_without_a_snapshot(raw_publisher: RawPublisher) -> None:
    """A diff that starts listening before the run's first message hears everything live and is
    sent no snapshot: it stops listening once the start is heard, without saying a snapshot is
    missing (it waited out its whole --listen, then said so, before)."""
    heard: list[RunRecord] = []
    accepted = raw_publisher.pub.get_monitor_socket(zmq.EVENT_ACCEPTED)
    started = time.monotonic()
    listener = threading.Thread(target=lambda: heard.append(load_run(raw_publisher.endpoint, listen_s=20.0)))
    listener.start()
    try:
        assert accepted.poll(10_000), "the diff did not connect"
        time.sleep(0.3)  # its subscription reaches the PUB socket
        raw_publisher.send(raw_publisher.builder.run_start())
        for step in range(1, 6):
            raw_publisher.metrics(step, loss=2.0 / step)
    finally:
        listener.join(timeout=30)
        raw_publisher.pub.disable_monitor()
        accepted.close(linger=0)
    [record] = heard
    assert time.monotonic() - started < 10, "listened on after the start was heard"
    assert record.start is not None and record.last_step == 5
    assert not any("no snapshot came" in note for note in record.notes), record.notes


def test_a_run_that_cannot_be_read_is_an_error_that_names_it(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = diff(capsys, str(tmp_path / "nowhere"), str(runs / "base"))
    assert missing.returncode == 2 and missing.stdout == ""
    assert f"no recording {tmp_path / 'nowhere'}: no such file" in missing.stderr
    junk = tmp_path / "junk.jsonl"
    junk.write_text("not json\n")
    broken = diff(capsys, str(runs / "base"), str(junk))
    assert broken.returncode == 2
    assert f"no tuimon messages in {junk}" in broken.stderr and "junk.jsonl:1" in broken.stderr


def synthetic(name: str, *, spike_at: int | None = None, nan_at: int | None = None) -> list[dict[str, Any]]:
    """A run's messages: a noisy falling loss (the same noise whatever the options), with one loss
    spike and its event, or a NaN loss from a step on with its event and a violated invariant."""
    noise = random.Random(7)
    builder = RunBuilder(name)
    messages = [builder.run_start()]
    for step in range(1, 301):
        builder.ts += 0.1
        loss = 2.0 / (1 + step / 50) + noise.gauss(0, 0.05)
        if step == spike_at:
            loss = 20.0
            messages.append(builder.event(step, "0-1", "loss_spike", "warning", "loss jumped"))
        if nan_at is not None and step >= nan_at:
            loss = math.nan
            if step == nan_at:
                messages.append(builder.event(step, "0-2", "nonfinite_loss", "critical", "loss is nan"))
                messages.append(builder.invariant("grads_cleared", "violated", step, "not cleared"))
        messages.append(builder.metrics(step, loss=loss, lr=0.01))
    messages.append(builder.message("run_end", step=300, status="completed"))
    return messages


def test_one_spike_is_not_a_parting_but_its_event_is_a_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clean = write_recording(tmp_path / "clean.jsonl", synthetic("clean"))
    spiked = write_recording(tmp_path / "spiked.jsonl", synthetic("spiked", spike_at=120))
    report = json.loads(diff(capsys, str(clean), str(spiked), "--json").stdout)
    assert report["curves"]["loss"]["parted"] is None
    assert [(e["only_in"], e["kind"], e["step"]) for e in report["events"]] == [("B", "loss_spike", 120)]
    assert report["counted"] == ["loss_spike only in B"]


def test_a_nan_parts_the_runs_at_its_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clean = write_recording(tmp_path / "clean.jsonl", synthetic("clean"))
    broken = write_recording(tmp_path / "broken.jsonl", synthetic("broken", nan_at=200))
    result = diff(capsys, str(clean), str(broken))
    assert result.returncode == 1
    assert "parts at step 200: A" in result.stdout and "one of them not finite" in result.stdout
    report = json.loads(diff(capsys, str(clean), str(broken), "--json").stdout)
    assert report["curves"]["loss"]["parted"]["b"] == "nan"
    assert [d["name"] for d in report["invariants"]] == ["grads_cleared"]


def gradient_norms(name: str, every: int, *, shift_after: int | None = None) -> list[dict[str, Any]]:
    """A run whose gradient norm (correlated noise around a slow decay, the same whatever the
    options) was measured on every ``every``-th step, as a run slowed by its machine's load measures
    it (its time budget); from ``shift_after`` on, 0.5 higher."""
    noise = random.Random(6)
    builder = RunBuilder(name)
    messages = [builder.run_start()]
    drift = 0.0
    for step in range(1, 301):
        builder.ts += 0.1
        drift = 0.7 * drift + noise.gauss(0, 0.1)
        values = {"loss": 1.0, "lr": 0.01}
        if (step - 1) % every == 0:
            shift = 0.5 if shift_after is not None and step > shift_after else 0.0
            values["grad_norm"] = 1.0 + drift + 0.5 * 0.99**step + shift
        messages.append(builder.metrics(step, **values))
    messages.append(builder.message("run_end", step=300, status="completed"))
    return messages


def test_a_run_that_measured_the_gradient_norm_on_fewer_steps_is_compared_where_it_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same gradient norms, one run reading them on every 16th step only: compared at those
    steps they agree (read at the other run's steps, the sparse run's straight lines across its
    gaps parted them); a lasting shift in the sparse run is still found, after it starts."""
    dense = write_recording(tmp_path / "dense.jsonl", gradient_norms("dense", 1))
    sparse = write_recording(tmp_path / "sparse.jsonl", gradient_norms("sparse", 16))
    result = diff(capsys, str(dense), str(sparse))
    assert result.returncode == 0, result.stdout
    report = json.loads(diff(capsys, str(dense), str(sparse), "--json").stdout)
    assert report["curves"]["grad_norm"] == {"compared_steps": 19, "parted": None, "rejoined": None}

    shifted = write_recording(tmp_path / "shifted.jsonl", gradient_norms("shifted", 16, shift_after=60))
    report = json.loads(diff(capsys, str(dense), str(shifted), "--json").stdout)
    assert report["curves"]["grad_norm"]["parted"]["step"] > 60


# --------------------------------------------------------------------------------- --baseline


@pytest.fixture
def replayed(runs: Path) -> Iterator[Any]:
    """Replay a recording against ``base`` as ``tuimon replay --baseline`` wires it."""
    baseline = load_baseline(str(runs / "base"))

    def source(name: str) -> ReplaySource:
        files = sorted(runs.glob(f"{name}.rank*.jsonl"))
        return ReplaySource(files, speed=math.inf,
                            tap=lambda store: BaselineWatch(store, baseline, store))

    yield baseline, source


def chart_text(app: TuimonApp) -> str:
    return app.query_one(PlotextPlot).render().plain


async def test_the_baseline_is_drawn_and_leaving_its_band_is_an_event(replayed: Any) -> None:
    baseline, source = replayed
    replay = source("other")
    app = TuimonApp(replay, baseline=baseline)
    async with app.run_test(size=(160, 48)) as pilot:
        def departed() -> list[Any]:
            events = replay.store.events("other")
            return [e for e in events if e.kind == KIND and e.details["metric"] == "loss"]

        await wait_for_screen(pilot, departed, what="a baseline_departure event on the loss")
        [event] = departed()  # one episode, however long the run stays out
        assert event.details["direction"] == "below" and event.severity == "info"
        assert event.details["baseline_run"] == "base" and event.step <= 40
        log = app.query_one(EventLog)
        await wait_for_screen(pilot, lambda: event.id in log.rows, what="the event in the log")
        assert str(log.get_cell(event.id, "kind")) == KIND
        await wait_for_screen(pilot, lambda: "baseline base" in chart_text(app), what="the chart's baseline")
        chart = chart_text(app)
        assert "█" in chart, "the band is shaded behind the run's line"
        await pilot.press("s")  # the throughput has its band too
        await wait_for_screen(pilot, lambda: "samples_per_s (samples/s)  last" in chart_text(app)
                              and "baseline base" in chart_text(app), what="the baseline's throughput")


async def test_a_run_like_the_baseline_stays_in_its_band(replayed: Any) -> None:
    baseline, source = replayed
    replay = source("same")
    app = TuimonApp(replay, baseline=baseline)
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for_screen(pilot, lambda: "ENDED" in str(app.query_one("#header").visual), what="the end")
        await pilot.pause(0.2)
        events = replay.store.events("same")
        assert not [e for e in events if e.kind == KIND and e.details["metric"] == "loss"]


def test_a_baseline_that_cannot_be_read_stops_the_command_before_the_screen(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in ("replay", "watch"):
        target = str(tmp_path / "x.jsonl") if command == "replay" else "5555"
        assert main([command, "--baseline", str(tmp_path / "none"), target]) == 2
        assert f"no baseline recording {tmp_path / 'none'}" in capsys.readouterr().err
