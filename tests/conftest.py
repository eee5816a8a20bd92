"""Shared fixtures for the viewer's tests: synthetic runs, recordings, a protocol-level publisher.

Everything here is real: messages are built with ``publisher.wire.protocol``, recordings are files,
and :class:`RawPublisher` drives real ZeroMQ PUB and ROUTER sockets on 127.0.0.1 exactly as
docs/protocol.md says, so the receiver is tested against the contract rather than against one
implementation of it (tests with the real ``publisher.wire.transport.Publisher`` exist as well).
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import zmq

from publisher.wire.protocol import decode, encode, make_message, wire_numbers
from tuimon.sink import Batch
from tuimon.store import Store

T0 = 1_700_000_000.0
HOST = "testhost"

# pytest-xdist's workers set COLUMNS=80 and LINES=24, which every program the tests start would
# take over the size of its pty (Textual, argparse's help): the tests' processes see what a
# user's shell gives them instead.
for _size in ("COLUMNS", "LINES"):
    os.environ.pop(_size, None)

#: Modules that measure time on this machine (detection delays against their budgets, healthy runs
#: that must not look slow, waits for a CPU): marked ``solo``, which ``make test`` runs alone after
#: the rest has run in two processes, so that another test's work is not what they measure.
SOLO_MODULES = frozenset({"test_faults", "test_invariants", "test_invariants_ddp", "test_cpu_wait"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.stem in SOLO_MODULES:
            item.add_marker(pytest.mark.solo)


# ------------------------------------------------------------------------------------ synthetic runs


class RunBuilder:
    """Builds one sender's messages with consecutive ``seq`` numbers and a clock in ``step_s`` steps."""

    def __init__(self, run: str = "synthetic", rank: int = 0, *, t0: float = T0) -> None:
        self.run = run
        self.rank = rank
        self.seq = 0
        self.ts = t0

    def message(self, msg_type: str, step: int | None = None, **body: Any) -> dict[str, Any]:
        message = make_message(
            msg_type, run=self.run, rank=self.rank, host=HOST, ts=self.ts, seq=self.seq, step=step, **body
        )
        self.seq += 1
        return message

    def run_start(self) -> dict[str, Any]:
        return self.message(
            "run_start",
            config={"lr": 0.01, "batch_size": 32},
            seed=1,
            argv=["train.py"],
            cwd="/tmp",
            pid=1,
            world_size=1,
            versions={"python": "3.11"},
            gpu_source="simulated",
        )

    def metrics(self, step: int, **values: float) -> dict[str, Any]:
        return self.message("metrics", step=step, metrics=wire_numbers(values))

    def gpu(
        self, step: int, utils: list[float], *, throttle: dict[int, list[str]] | None = None
    ) -> dict[str, Any]:
        devices = [
            {
                "index": index,
                "name": "Simulated GPU",
                "util": util,
                "mem_used": 40 * 1024**3,
                "mem_total": 80 * 1024**3,
                "temp_c": 60,
                "power_w": 300.0,
                "power_limit_w": 400.0,
                "sm_clock_mhz": 1800,
                "throttle": (throttle or {}).get(index, []),
                "ecc_errors": 0,
            }
            for index, util in enumerate(utils)
        ]
        return self.message("gpu", step=step, simulated=True, devices=devices)

    def event(
        self, step: int, event_id: str, kind: str, severity: str, message: str, count: int = 1, **details: Any
    ) -> dict[str, Any]:
        return self.message(
            "event",
            step=step,
            id=event_id,
            severity=severity,
            kind=kind,
            message=message,
            details=details,
            count=count,
        )

    def invariant(self, name: str, status: str, step: int | None, message: str) -> dict[str, Any]:
        return self.message("invariant", step=step, name=name, status=status, message=message, details={})

    def heartbeat(self, step: int, snapshot: str = "tcp://127.0.0.1:1", dropped: int = 0) -> dict[str, Any]:
        stats = {"sent": self.seq, "dropped": dropped, "queued": 0, "recorded": self.seq}
        return self.message("heartbeat", step=step, snapshot=snapshot, stats=stats)


def synthetic_run(
    run: str = "synthetic", steps: int = 300, *, step_s: float = 0.1, t0: float = T0, end: bool = True
) -> list[dict[str, Any]]:
    """A small, complete run: 4 simulated GPUs (GPU 2 starving from step 100), a loss spike at step
    120 whose episode is updated at 130 (same id, count 2), a NaN loss at 200, invariants (one
    violated at 150), heartbeats, and ``run_end`` when ``end``."""
    builder = RunBuilder(run, t0=t0)
    messages = [builder.run_start()]
    for step in range(steps):
        builder.ts = t0 + step * step_s
        loss = float("nan") if step == 200 else (50.0 if step == 120 else 2.0 / (1 + step / 50))
        messages.append(
            builder.metrics(step, loss=loss, lr=0.01, grad_norm=1.0 + step % 3, samples_per_s=1000.0 + step)
        )
        if step % 10 == 0:
            utils = [95.0, 94.0, 10.0 if step >= 100 else 93.0, 96.0]
            messages.append(builder.gpu(step, utils, throttle={1: ["hw_thermal"]} if step >= 250 else None))
            messages.append(builder.heartbeat(step))
        if step == 50:
            messages.append(builder.invariant("optimizer_changes_params", "ok", 50, "parameters changed"))
            messages.append(
                builder.invariant("grads_cleared", "unchecked", None, "waiting for a second step")
            )
        if step == 120:
            messages.append(
                builder.event(
                    120,
                    "0-1",
                    "loss_spike",
                    "warning",
                    "loss 50 at step 120 is 25x its mean",
                    value=50.0,
                    baseline=2.0,
                    likely_causes=["a corrupted batch"],
                )
            )
        if step == 130:
            messages.append(
                builder.event(
                    120,
                    "0-1",
                    "loss_spike",
                    "warning",
                    "loss spiking again at 130",
                    count=2,
                    value=48.0,
                    baseline=2.0,
                    likely_causes=["a corrupted batch"],
                )
            )
        if step == 150:
            messages.append(builder.invariant("grads_cleared", "violated", 150, "gradients not cleared"))
        if step == 200:
            messages.append(
                builder.event(
                    200,
                    "0-2",
                    "nonfinite_loss",
                    "critical",
                    "loss is nan at step 200",
                    value="nan",
                    likely_causes=["learning rate too high"],
                )
            )
    if end:
        builder.ts = t0 + steps * step_s
        messages.append(builder.message("run_end", step=steps - 1, status="completed"))
    return messages


class FedSource:
    """A source whose store the test fills itself (with real decoded messages): the app starts,
    stops and names it, and the test decides what arrives when. ``focused`` records the ranks the
    app asked to receive in full, as a live source behind a relay is asked."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.focused: list[tuple[str, int]] = []

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def where(self) -> str:
        return "tcp://login1:7000 (root relay)"

    def focus_rank(self, run: str, rank: int) -> None:
        self.focused.append((run, rank))


JOB_RUN = "llama"
ROOT_RELAY = "root@login1"


def decoded(message: dict[str, Any]) -> dict[str, Any]:
    """A message as a viewer gets it: encoded for the wire and decoded (validated) again."""
    return decode(encode(message))


def _rank_figures(rank: int, step: int, node: int, steps: int) -> tuple[dict[str, float], dict[str, Any]]:
    """One rank's metrics and GPU reading at ``step``, with the job's scripted problems: rank 517
    straggles (slow steps, long data waits, idle GPU), rank 3001 hangs half way, node 200 runs hot,
    node 300's ranks drift to a higher loss."""
    loss = 3.0 / (1 + step / 8) * (1 + ((rank * 13) % 17 - 8) * 0.01) + (0.4 if node == 300 else 0.0)
    step_time, data_time = 0.25 + (rank % 5) * 0.002, 0.01 + (rank % 3) * 0.001
    compute_time = 0.2 + (rank % 4) * 0.001
    util = 92.0 + (rank * 37) % 7
    if rank == 517:
        step_time, data_time, util = 0.42, 0.17, 35.0
    if rank == 3001 and step > steps // 2:
        util = 0.0
    gpu = {
        "index": rank % 8,
        "name": "H100",
        "util": util,
        "mem_used": (40 + rank % 30) * 1024**3,
        "mem_total": 80 * 1024**3,
        "temp_c": 86.0 if node == 200 else 55.0 + rank % 9,
        "power_w": 500.0,
        "sm_clock_mhz": 1980,
    }
    return {"loss": loss, "step_time": step_time, "data_time": data_time, "compute_time": compute_time}, gpu


def job_batches(
    nodes: int = 512, gpus_per_node: int = 8, steps: int = 24, *, t0: float = T0
) -> list[list[dict[str, Any]]]:
    """A job of ``nodes`` nodes of ``gpus_per_node`` ranks (one GPU each) as a viewer at the root
    relay receives it: one batch per half second of node summaries (made by the real
    :class:`~tuimon.relay.summary.NodeSummarizer` from each rank's metrics and GPU readings), then
    a last batch with every relay's beat and the root's findings: rank 517 a straggler, rank 3001
    hung, rank 4095 lost (when the job is that big), and rank 12 a straggler that is over.

    The last message's time is :func:`job_end_ts`; a store whose clock reads a second later shows
    the findings as current."""
    from tuimon.relay.summary import NodeSummarizer

    names = [f"node{n:03d}" for n in range(nodes)]
    summarizers = [NodeSummarizer(name) for name in names]
    batches = []
    for step in range(steps):
        ts, now = t0 + step * 0.5, step * 0.5
        batch = []
        for node, (name, summarizer) in enumerate(zip(names, summarizers, strict=True)):
            for rank in range(node * gpus_per_node, (node + 1) * gpus_per_node):
                if rank == 4095 and step >= steps - 6:
                    continue  # lost: nothing new from it
                shown = min(step, steps // 2) if rank == 3001 else step
                metrics, gpu = _rank_figures(rank, shown, node, steps)
                sender = {"run": JOB_RUN, "rank": rank, "host": name, "ts": ts, "step": shown}
                numbers = wire_numbers(metrics)
                summarizer.observe(make_message("metrics", seq=2 * step, metrics=numbers, **sender), now)
                summarizer.observe(make_message("gpu", seq=2 * step + 1, devices=[gpu], **sender), now)
            for run, rank, body in summarizer.summaries(now):
                summary = make_message("summary", run=run, rank=rank, host=name, ts=ts, seq=step, **body)
                batch.append(decoded(summary))
        batches.append(batch)
    end = job_end_ts(steps, t0)
    relays = [(f"node@{name}", name, "node", "tcp://login1:7001") for name in names]
    relays.append((ROOT_RELAY, "login1", "root", None))
    stats = {"in": 0, "in_bytes": 0, "out": 0, "out_bytes": 0}
    beats = [
        decoded(make_message("relay", run=relay, rank=0, host=host, ts=end, seq=steps, role=role,
                             listen="tcp://127.0.0.1:7000", upstream=upstream, publishers=gpus_per_node,
                             ranks=[], stats=stats))
        for relay, host, role, upstream in relays
    ]
    findings = [
        (12, "straggler", "warning", end - 60, 2, "rank 12 on node001 is a straggler: steps take 330 ms"),
        (517, "straggler", "warning", end, 3,
         "rank 517 on node064 is a straggler: waits 160 ms more per step for data than the fastest"),
        (3001, "hang", "critical", end, 2,
         "rank 3001 on node375 stuck at step 12 for 6 s while other ranks advance (heartbeats continue)"),
        (4095, "rank_lost", "critical", end, 1,
         "rank 4095 on node511 silent for 5 s (last step 17): its process or node may be gone"),
    ]
    events = [
        job_event(rank, kind, severity, ts, count, text, number)
        for number, (rank, kind, severity, ts, count, text) in enumerate(findings)
        if rank < nodes * gpus_per_node
    ]
    return [*batches, beats + events]


@functools.cache
def big_job() -> tuple[tuple[dict[str, Any], ...], ...]:
    """:func:`job_batches` of 512 nodes of 8 GPUs, made once per session (a few seconds): tests
    share the messages and never change them (the store does not either)."""
    return tuple(tuple(batch) for batch in job_batches())


def job_store(batches: Iterable[Sequence[dict[str, Any]]], steps: int = 24) -> Store:
    """A store fed ``batches`` as a viewer at the root would be, its clock a second after the job's
    last message. The loss band takes a point each time the job view is read, at most every
    ``tuimon.store.job.BAND_PERIOD_S`` (patch it to 0 for one point a batch, as tests do)."""
    end = job_end_ts(steps)
    store = Store(clock=lambda: end + 1)
    for batch in batches:
        store.deliver(Batch(batch))
        store.job_view(JOB_RUN)
    return store


def job_end_ts(steps: int = 24, t0: float = T0) -> float:
    return t0 + (steps - 1) * 0.5


def job_event(rank: int, kind: str, severity: str, ts: float, count: int, text: str, number: int,
              gpus_per_node: int = 8) -> dict[str, Any]:
    """A finding of the root relay about ``rank`` (docs/protocol.md: ``by`` names the relay)."""
    host = f"node{rank // gpus_per_node:03d}"
    return decoded(make_message(
        "event", run=JOB_RUN, rank=rank, host=host, ts=ts, seq=1000 + number, step=12,
        id=f"{ROOT_RELAY}/{number}", kind=kind, severity=severity, message=text,
        details={"rank": rank, "host": host}, count=count, by=ROOT_RELAY,
    ))


def write_recording(
    path: Path, messages: list[dict[str, Any]], *, bad_lines: dict[int, bytes] | None = None
) -> Path:
    """Write ``messages`` as JSON Lines; ``bad_lines`` inserts raw lines at those (1-based) line numbers."""
    lines = [encode(message) for message in messages]
    for number, raw in sorted((bad_lines or {}).items()):
        lines.insert(number - 1, raw)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    """A recording of :func:`synthetic_run` (30 s of recorded time)."""
    return write_recording(tmp_path / "synthetic.jsonl", synthetic_run())


# ------------------------------------------------------------------------------ protocol-level peer


class RawPublisher:
    """A publisher reduced to the protocol: a PUB and a snapshot ROUTER on random loopback ports.

    Driven from the test's thread (its sockets are used by that thread only). It keeps what it
    sent so that a snapshot can be built from it and the test can compare what the viewer shows.
    """

    def __init__(self, context: zmq.Context, run: str = "raw", rank: int = 0) -> None:
        self.builder = RunBuilder(run, rank, t0=time.time())
        self.pub = context.socket(zmq.PUB)
        self.pub.linger = 0
        self.pub.bind("tcp://127.0.0.1:*")
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.router = context.socket(zmq.ROUTER)
        self.router.linger = 0
        self.router.bind("tcp://127.0.0.1:*")
        self.snapshot_endpoint = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.sent: list[dict[str, Any]] = []

    def send(self, message: dict[str, Any]) -> dict[str, Any]:
        self.pub.send(encode(message))
        self.sent.append(message)
        return message

    def send_new(self, msg_type: str, step: int | None = None, **body: Any) -> dict[str, Any]:
        self.builder.ts = time.time()
        return self.send(self.builder.message(msg_type, step=step, **body))

    def metrics(self, step: int, loss: float) -> dict[str, Any]:
        self.builder.ts = time.time()
        return self.send(self.builder.metrics(step, loss=loss))

    def heartbeat(self, step: int) -> dict[str, Any]:
        self.builder.ts = time.time()
        return self.send(self.builder.heartbeat(step, snapshot=self.snapshot_endpoint))

    def poll_request(self, timeout_ms: int = 0) -> bytes | None:
        """The identity of a viewer that asked for a snapshot, if one did."""
        if not self.router.poll(timeout_ms):
            return None
        identity, request = self.router.recv_multipart()
        assert json.loads(request) == {"v": 1, "type": "snapshot_request"}
        return identity

    def snapshot_frames(self) -> tuple[int, list[bytes]]:
        """What the protocol requires a snapshot to hold, built from everything sent so far."""
        kept = [m for m in self.sent if m["type"] in ("run_start", "metrics", "event")]
        latest: dict[Any, dict[str, Any]] = {}
        for message in self.sent:
            if message["type"] == "invariant":
                latest[("invariant", message["name"])] = message
            elif message["type"] == "gpu":
                latest["gpu"] = message
        chosen = sorted(kept + list(latest.values()), key=lambda m: m["seq"])
        return self.sent[-1]["seq"], [encode(m) for m in chosen]

    def reply(self, identity: bytes, seq: int, frames: list[bytes]) -> None:
        header = json.dumps({"v": 1, "type": "snapshot", "seq": seq, "count": len(frames)}).encode()
        self.router.send_multipart([identity, header, *frames])

    def close(self) -> None:
        self.pub.close(0)
        self.router.close(0)


@pytest.fixture
def context() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def raw_publisher(context: zmq.Context) -> Iterator[RawPublisher]:
    publisher = RawPublisher(context)
    yield publisher
    publisher.close()


# ------------------------------------------------------------------------------------------ waiting


def wait_until(
    condition: Callable[[], object],
    timeout_s: float = 5.0,
    what: str = "condition",
    tick: Callable[[], None] | None = None,
) -> None:
    """Poll ``condition`` (calling ``tick`` between polls, e.g. to keep a peer publishing)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        if tick is not None:
            tick()
        time.sleep(0.01)


async def wait_for_screen(
    pilot: Any, condition: Callable[[], object], timeout_s: float = 10.0, what: str = "screen condition"
) -> None:
    """Let the app run until ``condition`` holds (read widgets in it, as a user reads the screen)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        await pilot.pause(0.05)


# ------------------------------------------------------------------------------- a real terminal

#: The `tuimon` command, run by this interpreter.
TUIMON = [sys.executable, "-m", "tuimon.cli"]


class Terminal:
    """A pty of 160x48 with a `tuimon` process on it; reads its output so it never blocks."""

    def __init__(self, args: list[str], env: dict[str, str], *, controlling: bool) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 48, 160, 0, 0))
        self.master: int | None = master
        self.output = b""

        def become_session_leader_of_the_tty() -> None:
            os.setsid()
            if controlling:  # like sshd: the pty is the session's controlling terminal
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.process = subprocess.Popen(
            [*TUIMON, *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**os.environ, "TERM": "xterm-256color", **env},
            preexec_fn=become_session_leader_of_the_tty,
        )
        os.close(slave)

    def read_until(self, text: bytes, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.output:
            assert time.monotonic() < deadline, f"{text!r} never shown; got {self.output[-500:]!r}"
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                self.output += os.read(self.master, 65536)

    def close(self) -> None:
        if self.master is not None:
            os.close(self.master)
            self.master = None

    def kill(self) -> None:
        self.close()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


# ------------------------------------------------------------------------------ knowledge base


@pytest.fixture(autouse=True)
def private_runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own run registry through $TUIMON_RUNTIME_DIR: publishers a test starts
    never show up in the developer's `tuimon watch`, nor in another test's."""
    directory = tmp_path / "runtime"
    monkeypatch.setenv("TUIMON_RUNTIME_DIR", str(directory))
    return directory


@pytest.fixture(autouse=True)
def private_kb_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's dashboard (and `tuimon` subprocess) gets its own knowledge base folder through
    $TUIMON_KB, never the developer's ~/.local/share/tuimon/kb: the dashboard opens its knowledge
    base when it starts. Tests that need a specific folder pass --kb / kb_dir, which wins."""
    folder = tmp_path / "default-kb"
    monkeypatch.setenv("TUIMON_KB", str(folder))
    return folder
