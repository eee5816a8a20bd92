"""`tuimon tail` as a user runs it: a real subprocess reading real publishers over 127.0.0.1.

What it prints must be what a viewer would have applied (snapshot first, then newer live messages,
each once, in order), every line valid JSON a consumer can trust (malformed frames are counted on
stderr, never printed), and it must end cleanly however it is ended: --for, a signal, or a reader
that stops reading.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers.cli import TUIMON
from helpers.peers import RawPublisher
from helpers.waiting import wait_until

from publisher.wire.protocol import encode
from publisher.wire.transport import Publisher
from tuimon.cli import main


def tail(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`tuimon tail ARGS` in a subprocess, stdout and stderr piped, unbuffered here: a line read
    with ``readline`` is never followed by bytes hidden in a buffer that ``communicate`` skips."""
    return subprocess.Popen(
        [*TUIMON, "tail", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
        env=os.environ.copy() if env is None else env,
    )


def parse(stdout: bytes) -> list[dict[str, Any]]:
    """Every line of tail's output as a message; each must be JSON, re-encoded compactly."""
    lines = stdout.splitlines()
    messages = [json.loads(line) for line in lines]
    for line, message in zip(lines, messages, strict=True):
        assert encode(message) == line  # compact: exactly the protocol's own encoding
    return messages


def assert_clean_exit(returncode: int, stderr: bytes, printed: int) -> None:
    text = stderr.decode()
    assert returncode == 0, text
    assert "Traceback" not in text and "BrokenPipe" not in text and "Exception ignored" not in text, text
    assert text.strip().splitlines()[-1].startswith(f"tuimon tail: {printed} messages printed"), text


class Feeder:
    """Keeps a real Publisher training-like: one metrics message every 10 ms, from a thread."""

    def __init__(self, publisher: Publisher, first_step: int) -> None:
        self.publisher = publisher
        self.step = first_step
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.publisher.publish("metrics", step=self.step, metrics={"loss": 1.0 / (1 + self.step)})
            self.step += 1

    def __enter__(self) -> Feeder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def running() -> Iterator[Publisher]:
    """A real Publisher mid-run: its start and 50 steps already sent, before any tail exists."""
    publisher = Publisher("tailed", heartbeat_s=0.2)
    try:
        publisher.publish("run_start", config={"lr": 0.1}, world_size=1, gpu_source="none")
        for step in range(50):
            publisher.publish("metrics", step=step, metrics={"loss": 1.0 / (1 + step)})
        wait_until(lambda: publisher.stats()["sent"] >= 51, what="the history sent")
        yield publisher
    finally:
        publisher.close()


def test_a_late_joiner_gets_the_snapshot_first_then_every_later_step_once_in_order(
    running: Publisher,
) -> None:
    with Feeder(running, first_step=50):
        done = subprocess.run(
            [*TUIMON, "tail", running.endpoint, "--for", "2"], capture_output=True, timeout=60, check=False
        )

    messages = parse(done.stdout)
    assert_clean_exit(done.returncode, done.stderr, len(messages))
    assert messages[0]["type"] == "run_start" and messages[0]["config"] == {"lr": 0.1}
    steps = [message["step"] for message in messages if message["type"] == "metrics"]
    assert steps[:50] == list(range(50))  # sent before tail existed: only the snapshot has them
    assert steps == list(range(len(steps))) and len(steps) > 60  # then live ones: none missed, none twice
    seqs = [message["seq"] for message in messages]
    assert seqs == sorted(set(seqs))
    assert {message["host"] for message in messages} == {running.host}
    assert "0 malformed" in done.stderr.decode()


def test_malformed_frames_are_counted_by_reason_on_stderr_and_never_printed(context: zmq.Context) -> None:
    raw = RawPublisher(context, run="raw")
    try:
        raw.send(raw.builder.run_start())
        process = tail(raw.endpoint, "--for", "2")
        step, deadline = 0, time.monotonic() + 60
        while process.poll() is None and time.monotonic() < deadline:
            raw.pub.send(b"{not json")
            raw.pub.send(b'{"v": 2, "type": "metrics", "run": "raw"}')
            raw.metrics(step, loss=1.0)
            if step % 5 == 0:
                raw.heartbeat(step)
            if (identity := raw.poll_request()) is not None:  # a late joiner: answer as the protocol says
                raw.reply(identity, *raw.snapshot_frames())
            step += 1
            time.sleep(0.02)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        raw.close()

    messages = parse(stdout)
    assert_clean_exit(process.returncode, stderr, len(messages))
    assert messages, "no valid message printed"
    assert messages[0]["type"] == "run_start"
    assert all(message["v"] == 1 and message["run"] == "raw" for message in messages)
    summary = stderr.decode().strip().splitlines()[-1]
    assert "not JSON: " in summary and "wrong version: " in summary, summary
    counts = dict(part.rsplit(": ", 1) for part in summary.split("(", 1)[1].rstrip(")").split(", "))
    assert int(counts["not JSON"]) >= 1 and int(counts["wrong version"]) >= 1


def test_a_reader_that_stops_reading_ends_tail_quietly(running: Publisher) -> None:
    with Feeder(running, first_step=50):
        process = tail(running.endpoint)  # no --for: only the closed pipe can end it
        assert process.stdout is not None and process.stderr is not None
        first = [process.stdout.readline() for _ in range(3)]  # like `| head -3`
        process.stdout.close()
        returncode = process.wait(timeout=30)
        stderr = process.stderr.read()

    assert json.loads(first[0])["type"] == "run_start"
    text = stderr.decode()
    assert returncode == 0, text
    assert "Traceback" not in text and "BrokenPipe" not in text and "Exception ignored" not in text, text


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_tail_with_its_summary_and_exit_0(running: Publisher, signum: int) -> None:
    with Feeder(running, first_step=50):
        process = tail(running.endpoint)
        assert process.stdout is not None
        first = process.stdout.readline()  # running, its handlers installed
        process.send_signal(signum)
        rest, stderr = process.communicate(timeout=30)

    messages = parse(first + rest)
    assert messages[0]["type"] == "run_start"
    assert_clean_exit(process.returncode, stderr, len(messages))


def test_a_bad_address_is_one_line_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tail", "bad::endpoint"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("tuimon: error: bad endpoint 'bad::endpoint'")
    assert "tcp://127.0.0.1:5555" in error and "\n" not in error


# A real Monitor on a tiny CPU model, in its own process: trains until told to stop.
TRAINING = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import torch
    from publisher import Monitor

    stop = Path(sys.argv[1])
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with Monitor(model, optimizer, run="node-run", gpu="none") as mon:
        while not stop.exists():
            loss = model(torch.randn(8, 4)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mon.step(loss)
            time.sleep(0.01)
    """
)


def test_tuimon_host_renames_the_publisher_and_tail_without_an_address_still_finds_it(
    private_runtime_dir: Path, tmp_path: Path
) -> None:
    stop = tmp_path / "stop"
    viewer_env = {key: value for key, value in os.environ.items() if key != "TUIMON_HOST"}
    training = subprocess.Popen(
        [sys.executable, "-c", TRAINING, str(stop)], env={**viewer_env, "TUIMON_HOST": "nodeA"}
    )
    try:
        wait_until(lambda: any(private_runtime_dir.glob("node-run.*.json")), 90, "the run registered")
        [entry_file] = private_runtime_dir.glob("node-run.*.json")
        entry = json.loads(entry_file.read_text())
        assert (entry["host"], entry["machine"]) == ("nodeA", socket.gethostname())
        assert entry["pid"] == training.pid

        # The viewer has no TUIMON_HOST: it still finds the run in the registry (same machine).
        done = subprocess.run(
            [*TUIMON, "tail", "--for", "2"], capture_output=True, env=viewer_env, timeout=60, check=False
        )
    finally:
        stop.touch()
        training.wait(timeout=60)

    messages = parse(done.stdout)
    assert_clean_exit(done.returncode, done.stderr, len(messages))
    assert messages[0]["type"] == "run_start"
    assert messages[0]["repro"]["hostname"] == "nodeA"
    assert {message["host"] for message in messages} == {"nodeA"}
    assert {message["run"] for message in messages} == {"node-run"}
    steps = [message["step"] for message in messages if message["type"] == "metrics"]
    assert steps and steps == sorted(steps)
    assert training.returncode == 0
