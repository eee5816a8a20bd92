"""A Monitor's publisher runs in a process of its own (publisher/wire/sidecar.py): what a user sees of it.

Real training processes (subprocesses running a Monitor), real ZeroMQ subscribers, real signals.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import zmq
from helpers.publisher_client import Message, receive_until, subscribe
from helpers.recordings import read_messages
from helpers.waiting import wait_until

from publisher.monitor import Monitor
from publisher.wire import registry
from publisher.wire.protocol import decode
from publisher.wire.sidecar_link import SidecarPublisher
from publisher.wire.validation import ProtocolError

TRAINING = """
import sys, time, torch
from publisher.monitor import Monitor
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
mon = Monitor(model, optimizer, run="sidecar", record=sys.argv[1], gpu="none")
print(mon.endpoint, flush=True)
step = 0
while True:
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward(); optimizer.step(); optimizer.zero_grad()
    mon.step(loss)
    step += 1
    time.sleep(0.05)
"""


@contextmanager
def training(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    """A training process stepping every 50 ms: (process, its publisher's endpoint, its recording)."""
    record = tmp_path / "run.jsonl"
    process = subprocess.Popen([sys.executable, "-c", textwrap.dedent(TRAINING), str(record)],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        yield process, process.stdout.readline().strip(), record
    finally:
        process.kill()
        process.wait()


def is_heartbeat(message: Message) -> bool:
    return message["type"] == "heartbeat"


def test_a_killed_training_process_ends_its_run_as_failed_and_says_why(tmp_path: Path) -> None:
    context = zmq.Context()
    try:
        with training(tmp_path) as (process, endpoint, record):
            sub = subscribe(context, endpoint)
            receive_until(sub, lambda m: m["type"] == "metrics", timeout_s=30)
            process.kill()  # SIGKILL: no atexit, no close()
            end = receive_until(sub, lambda m: m["type"] == "run_end", timeout_s=10)[-1]
        assert end["status"] == "failed"
        assert f"pid {process.pid}" in end["error"] and "without closing" in end["error"]
        wait_until(lambda: read_messages(record)[-1]["type"] == "run_end",
                   what="the recording ending with run_end too")
    finally:
        context.destroy(linger=0)


def test_a_frozen_training_process_falls_silent_and_beats_again_when_it_resumes(tmp_path: Path) -> None:
    """Heartbeats say the training process is alive: while it is stopped (SIGSTOP: frozen, as one
    stuck with the GIL held), its publisher's process stops them, though it runs on."""
    context = zmq.Context()
    try:
        with training(tmp_path) as (process, endpoint, _):
            sub = subscribe(context, endpoint)
            receive_until(sub, is_heartbeat, timeout_s=30)
            process.send_signal(signal.SIGSTOP)
            try:
                time.sleep(3.0)  # SILENT_BEATS heartbeat periods, and one more
                while sub.poll(0):
                    sub.recv()
                assert not sub.poll(2500), "no heartbeat, nor anything else, while the process is frozen"
            finally:
                process.send_signal(signal.SIGCONT)
            receive_until(sub, is_heartbeat, timeout_s=5)
    finally:
        context.destroy(linger=0)


def test_the_run_is_published_by_another_process_that_ends_with_the_monitor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUIMON_RUNTIME_DIR", str(tmp_path / "runtime"))
    mon = Monitor(run="own-process", gpu="none")
    entry = next(entry for entry in registry.live_entries() if entry.run == "own-process")
    assert entry.pid == os.getpid() != mon.publisher.pid, "the entry names the training process"
    assert entry.pub == mon.endpoint
    mon.step(1.0)
    mon.close()
    with pytest.raises(ProcessLookupError):  # reaped by close()
        os.kill(mon.publisher.pid, 0)
    assert not [entry for entry in registry.live_entries() if entry.run == "own-process"]


def test_an_endpoint_the_publisher_cannot_bind_fails_the_monitor_at_once() -> None:
    with pytest.raises(ValueError, match=r"cannot publish on 'carrier-pigeon://here': not a tcp://"):
        Monitor(run="bad", gpu="none", endpoint="carrier-pigeon://here")


def test_a_message_that_cannot_be_encoded_is_dropped_alone_and_counted(tmp_path: Path) -> None:
    record = tmp_path / "run.jsonl"
    mon = Monitor(run="bad-body", gpu="none", record=record)
    mon.step(1.0)
    mon.publisher.publish("event", step=1, severity="info", kind="checkpoint", message="x",
                          details={"not JSON": object()})
    mon.step(2.0)
    time.sleep(0.3)
    assert mon.publisher.stats()["dropped"] == 1
    mon.close()
    metrics = [m["step"] for m in read_messages(record) if m["type"] == "metrics"]
    assert metrics == [1, 2]


def test_without_an_interpreter_to_start_the_monitor_publishes_from_a_thread_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """An embedded or frozen Python (no interpreter at sys.executable): monitoring still works."""
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python-here"))
    record = tmp_path / "run.jsonl"
    with caplog.at_level("WARNING"):
        mon = Monitor(run="embedded", gpu="none", record=record)
    for step in range(1, 61):  # every detector runs here then: a spike is still seen
        mon.step(1.0 + 0.01 * (step % 3) if step != 50 else 40.0)
    mon.close()
    assert "publishing from a thread of the training process instead" in caplog.text
    messages = read_messages(record)
    assert [m["type"] for m in messages][-2:] == ["metrics", "run_end"]
    assert [m["step"] for m in messages if m["type"] == "event" and m["kind"] == "loss_spike"][:1] == [50]


def test_the_loss_detectors_judge_in_the_publishers_process_which_never_loads_torch(tmp_path: Path) -> None:
    """The default suite's detectors of published metrics (loss spike among them) run where the
    metrics are published, off the training process's GIL; their events carry the replay record
    and ids of their own, and that process stays small: no torch in it."""
    record = tmp_path / "run.jsonl"
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    mon = Monitor(model, optimizer, run="judged-there", gpu="none", record=record)
    maps = Path(f"/proc/{mon.publisher.pid}/maps")
    for step in range(1, 201):
        loss = (model(torch.randn(16, 4)) - torch.randn(16, 2)).pow(2).mean()
        if step == 150:
            loss = loss * 500  # one corrupted batch
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mon.step(loss)
    own = mon.event("checkpoint", "saved", step=200)
    loaded = maps.read_text() if maps.exists() else None
    mon.close()
    if loaded is not None:
        assert "libtorch" not in loaded and "torch/lib" not in loaded
    events = [m for m in read_messages(record) if m["type"] == "event"]
    spikes = [m for m in events if m["kind"] == "loss_spike"]
    assert [m["step"] for m in spikes][:1] == [150], events
    assert spikes[0]["details"]["replay"]["run"] == "judged-there"
    assert spikes[0]["details"]["replay"]["step"] == 150
    assert len({m["id"] for m in events}) == len({(m["id"], m["kind"]) for m in events})
    assert own in {m["id"] for m in events} and own != spikes[0]["id"]


def test_a_publisher_process_whose_detectors_cannot_be_built_still_publishes_and_says_why(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """What watches the published messages is extra: a detector the publisher's process cannot
    build (a name it does not know) is logged there, and every message still goes out."""
    record = tmp_path / "run.jsonl"
    publisher = SidecarPublisher("unwatched", record=record, detectors=["NoSuchDetector"])
    for step in range(1, 4):
        publisher.publish("metrics", step=step, metrics={"loss": 1.0})
    publisher.close()
    assert [m["step"] for m in read_messages(record) if m["type"] == "metrics"] == [1, 2, 3]
    assert "not detectors of published metrics: NoSuchDetector" in capfd.readouterr().err


def test_a_metrics_message_its_detectors_cannot_read_is_skipped_alone_and_they_go_on_judging(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A malformed ``metrics`` message (from a bug, or a caller of the publisher's own ``publish``)
    must not switch off the detectors that run in the publisher's process: they skip it, say so
    once, and still name the loss spike that comes later; every message goes out, and a reader
    refuses the two bad ones alone."""
    record = tmp_path / "run.jsonl"
    publisher = SidecarPublisher("misfed", record=record, detectors=["LossSpike"])
    for step in range(1, 61):
        if step == 20:
            publisher.publish("metrics", step=step, metrics=[1.0, 2.0])  # not an object
        elif step == 30:
            publisher.publish("metrics", step=step, metrics={"loss": "one"})  # not a number
        else:
            loss = 40.0 if step == 50 else 1.0 + 0.01 * (step % 3)
            publisher.publish("metrics", step=step, metrics={"loss": loss})
    publisher.close()
    messages, refused = [], 0
    for line in record.read_bytes().splitlines():
        try:
            messages.append(decode(line))
        except ProtocolError:
            refused += 1
    assert refused == 2
    good = [step for step in range(1, 61) if step not in (20, 30)]
    assert [m["step"] for m in messages if m["type"] == "metrics"] == good
    spikes = [m["step"] for m in messages if m["type"] == "event" and m["kind"] == "loss_spike"]
    assert spikes[:1] == [50], messages[-5:]
    err = capfd.readouterr().err
    assert err.count("could not read a metrics message") == 1, err
