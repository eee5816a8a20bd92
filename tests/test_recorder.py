"""Recordings: byte for byte the wire, on disk within a second, complete up to a crash."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import zmq
from helpers.publisher_client import receive_until, subscribe
from helpers.waiting import wait_until

from publisher.wire.protocol import decode, wire_numbers
from publisher.wire.recorder import Recorder
from publisher.wire.registry import live_entries
from publisher.wire.transport import Publisher


def test_recording_lines_are_exactly_the_frames_on_the_wire(tmp_path: Path, context: zmq.Context) -> None:
    path = tmp_path / "runs" / "today" / "run.jsonl"  # missing folders are created
    publisher = Publisher("rec", record=path, heartbeat_s=0.05)
    assert live_entries()[0].record == str(path)  # viewers can find the recording too
    sub = subscribe(context, publisher.endpoint)
    receive_until(sub, lambda m: m["type"] == "heartbeat")  # subscribed: nothing below is missed

    publisher.publish("run_start", config={"lr": 0.1}, seed=0, argv=["train.py"])
    publisher.publish("metrics", step=1, metrics=wire_numbers({"loss": math.nan, "lr": 0.1}))
    publisher.publish(
        "event",
        step=1,
        id="0-1",
        severity="critical",
        kind="nonfinite_loss",
        message="loss is NaN — check the data",
        details={"where": "λ"},
        count=1,
    )
    publisher.close()
    sub_frames = [sub.recv()]
    while b'"type":"run_end"' not in sub_frames[-1]:
        assert sub.poll(2000), "run_end never arrived"
        sub_frames.append(sub.recv())

    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""  # every line is terminated
    recorded = lines[:-1]
    assert recorded[-len(sub_frames) :] == sub_frames
    assert [decode(line)["type"] for line in sub_frames][-4:] == ["run_start", "metrics", "event", "run_end"]
    assert [decode(line)["seq"] for line in recorded] == list(range(len(recorded)))


def test_recorded_data_reaches_the_disk_within_a_second_without_close(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    publisher = Publisher("rec", record=path)
    try:
        published_at = time.monotonic()
        publisher.publish("metrics", step=41, metrics={"loss": 2.5})

        def on_disk() -> bool:
            with open(path, "rb") as other_handle:  # what `tuimon replay` or `tail -f` would see
                return b'"step":41' in other_handle.read()

        wait_until(on_disk, timeout_s=1.0, what="the metrics line on disk")
        assert time.monotonic() - published_at < 1.0
    finally:
        publisher.close()


CRASHING_TRAINER = textwrap.dedent(
    """
    import os, sys, time
    from publisher.wire.transport import Publisher

    how, path = sys.argv[1], sys.argv[2]
    publisher = Publisher("crash", record=path, heartbeat_s=60)
    publisher.publish("run_start", config={}, seed=0)
    step = 0
    print("ready", flush=True)
    started = time.monotonic()
    while time.monotonic() - started < 20:
        publisher.publish("metrics", step=step, metrics={"loss": 1.0})
        step += 1
        time.sleep(0.002)
        if how == "os_exit" and time.monotonic() - started > 1.2:
            print(time.time(), flush=True)
            os._exit(1)
    """
)


@pytest.mark.parametrize("how", ["sigkill", "os_exit"])
def test_a_crashed_trainer_loses_at_most_the_last_second(tmp_path: Path, how: str) -> None:
    path = tmp_path / "crash.jsonl"
    trainer = subprocess.Popen(
        [sys.executable, "-c", CRASHING_TRAINER, how, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert trainer.stdout is not None
        assert trainer.stdout.readline() == "ready\n"
        if how == "sigkill":
            time.sleep(1.2)
            died_at = time.time()
            trainer.send_signal(signal.SIGKILL)
        else:
            died_at = float(trainer.stdout.readline())
        trainer.wait(timeout=10)
    finally:
        trainer.kill()

    messages = [decode(line) for line in path.read_bytes().splitlines()]  # every line whole and valid
    assert messages[0]["type"] == "run_start"
    steps = [m["step"] for m in messages if m["type"] == "metrics"]
    assert steps == list(range(len(steps)))  # nothing missing in between
    assert messages[-1]["ts"] >= died_at - 1.0
    # Its registry entry outlived it; the next viewer clears it.
    assert live_entries() == []
    assert os.listdir(os.environ["TUIMON_RUNTIME_DIR"]) == []


def test_an_existing_recording_is_appended_to_not_destroyed(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_bytes(b'{"earlier":"run"}\n')
    recorder = Recorder(path)
    recorder.append(b'{"later":"run"}')
    recorder.close()
    recorder.close()

    assert path.read_bytes() == b'{"earlier":"run"}\n{"later":"run"}\n'


def test_a_recording_path_under_a_file_fails_naming_both(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    path = tmp_path / "notes.txt" / "run.jsonl"

    with pytest.raises(OSError, match=r"notes\.txt") as error:
        Recorder(path)
    assert str(path) in str(error.value)


def test_a_recording_path_that_is_a_folder_fails_naming_it(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError, match=str(tmp_path)):
        Recorder(tmp_path)


def test_the_publisher_refuses_to_start_with_an_unusable_recording_path(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError, match="cannot record to"):
        Publisher("rec", record=tmp_path)
    assert live_entries() == []
