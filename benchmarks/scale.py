"""How the relay tree's cost grows with the number of nodes: delivery, delay and CPU of each relay.

    python benchmarks/scale.py [--nodes 1,4,16,32] [--ranks-per-node 8] [--seconds 10] [--view all|job]
    python benchmarks/scale.py --quick
    python benchmarks/scale.py --hang [--nodes 32 --ranks-per-node 128] [--publishers judging|older]

Every process is real except the training: each simulated node is one process hosting one raw
ZeroMQ PUB socket per rank (no torch), sending what a training rank sends, protocol-valid
(``make_message`` + ``encode``, so the envelope prefix is the topic): ``metrics`` at 10 steps a
second (loss, lr, step_time, samples_per_s, data_time), one ``gpu`` reading (one device) and one
``heartbeat`` a second. Each node has its own runtime folder and host name (``$TUIMON_HOST=nodeI``)
and registers its ranks there as a Publisher does, so its node relay (``tuimon relay --upstream``,
its own process) finds them by scanning the registry, as on a real node. A root relay (``tuimon
relay --root``) gathers the node relays; the viewer is this process, one SUB at the root,
decoding every message it receives. It subscribes to everything (``--view all``), or to what a
job view takes from every rank (``--view job``: summaries, which carry the ranks' heartbeats,
events, relay beats; delays are then the summaries', from their relay to the viewer): subscriptions
travel up the tree (docs/protocol.md, "Topics"), so that is also what the relays forward. For each
size, over a window after a warm-up:

- offered/s: messages the publishers sent (counted by the senders), delivered/s: those the viewer
  received at the root, and lost: gaps in ``seq`` per sender (loss anywhere on the way; not with
  ``--view job``, where gaps are what the viewer filtered out) and publisher drops. Messages
  the relays make themselves (their ``relay`` beats, each node's ``summary``, the root's ``event``
  findings about the job) are counted apart, by type, and events by kind: they are not offered;
- delay: from each message's ``ts`` to its receipt, p50 and p95 (one machine, one clock);
- direct: the same delays for node 0's messages read in the same window by a second SUB connected
  straight to its publishers, so ``x direct`` is what the two relay hops add under the same load;
- CPU of each relay process over the window (psutil: user + system, all threads, in clock ticks of
  10 ms, so +-0.1 % of a core over 10 s), % of one core: the mean and the largest node relay, and
  the root; also the publishers' (per node process) and the whole machine's (% of all cores). A
  relay's CPU is all it does: the forwarding (ZeroMQ's I/O thread, the proxy's thread) and its own
  Python work on its main thread (registry scans, beats, summaries, the job watch), shown apart.

A baseline row comes first, in the same run: one node, no relay, the viewer connected directly to
its publishers. The root's CPU at 512 nodes is a straight line fitted through the sizes measured
(fixed cost + cost per node). It is pessimistic if anything: at low rates each message costs the
proxy a wake-up, and a busier root batches more messages per wake-up.

``--hang`` asks who a hung job blames instead. The ranks of one tree (by default 32 simulated
nodes of 128 ranks: 4,096, fewer relay processes than real 8-GPU nodes would have, so that the
tree fits 2 cores beside its simulated ranks; at 2 steps a second, heartbeats every second, no GPU
readings) train until the root hears every node, then all stop: one rank in its data fetch,
outside the collective (its heartbeats' stack ends in ``fetch_batch``, ``in_collective`` false),
every other one in the all-reduce (``in_collective`` true), as each rank's watchdog says it (docs/protocol.md,
``heartbeat``). With ``--publishers judging`` (today's) each rank judges its own stall and says
so as a publisher does (``hang`` from the culprit, ``collective_wait`` from every waiting rank,
said once); with ``older`` their heartbeats only say where they are and the root judges.
A viewer at the root, subscribed as a job view is, reads for ``--seconds`` and the benchmark
prints who was named first (rank, host, by whom, seconds after the culprit's last step; target
10 s), what the root itself said about it, every rank of a warning or worse (target: the culprit
only), how many ranks' ``run_start`` reached the root (each rank said it before any relay ran:
node relays ask for it), the events the root carried, and the relays' CPU meanwhile.

Why these numbers (libzmq's proxy, high-water marks, slow joiners, a shared machine): docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import heapq
import math
import multiprocessing as mp
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event
from pathlib import Path
from types import FrameType
from typing import Any

import psutil
import zmq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ingest import p95  # benchmarks/ is sys.path[0] when this file runs as a script

from publisher.wire import snapshot_gate, stall
from publisher.wire.hostname import ENV_HOST, host_name, machine_name
from publisher.wire.protocol import (
    ProtocolError,
    decode,
    encode,
    make_message,
    numbered_by_sender,
    wire_numbers,
)
from publisher.wire.registry import live_entries, register, unregister
from publisher.wire.topics import EVERYTHING, subscription
from tuimon.sources.subscriptions import JOB_TYPES

REPO = Path(__file__).resolve().parent.parent
RUN = "scale"
#: What a simulated rank sends.
PUBLISHED = ("metrics", "gpu", "heartbeat")
#: What a viewer subscribes to (``--view``): everything, or what the dashboard's job view takes from
#: every rank (node summaries, which carry the ranks' heartbeats, events, relay beats, starts and ends;
#: it also takes one focused rank's full stream, left out here), as a dashboard of 512 nodes would.
VIEWS = {"all": None, "job": JOB_TYPES}
#: A Publisher's default high-water mark (``publisher.wire.transport.Publisher``'s ``hwm``).
PUBLISHER_HWM = 10_000
#: The viewer's receive queue: large, so that what it misses is the relays' loss, not its own.
VIEWER_HWM = 1_000_000
GPU_PERIOD_S = 1.0
HEARTBEAT_PERIOD_S = 1.0
GIB = 1 << 30
#: Targets of the relay tree.
TARGET_DELAY_P95_S = 1.0
TARGET_NODE_RELAY_CPU = 5.0  # % of one core, for a node of 8 ranks
TARGET_NODE_RANKS = 8
TARGET_ROOT_CPU = 50.0  # % of one core, for a root of 512 nodes
TARGET_ROOT_NODES = 512
_PR_SET_PDEATHSIG = 1
#: Where a simulated rank's training thread is when a hang is simulated (``--hang``): the culprit
#: in its data fetch, outside any collective; the others in the gradient all-reduce.
FETCHING = ("/work/train.py:88 <module>", "/work/train.py:61 train", "/work/data.py:4 fetch_batch")
WAITING = ("/work/train.py:88 <module>", "/work/train.py:66 train",
           "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:81 wrapper",
           "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:2800 all_reduce")
#: Seconds between updates of a rank's own stall event while it lasts (publisher/detectors/episodes.py).
EPISODE_UPDATE_S = 2.0
#: The target: the rank outside the collective named at the root within this many seconds.
TARGET_NAMED_S = 10.0


# ------------------------------------------------------------------------------ processes


def die_with_parent() -> None:
    """Have the kernel send SIGTERM to this process when the benchmark dies, even by SIGKILL, so
    nothing outlives it (Linux prctl(2); elsewhere the benchmark's own clean-up has to do)."""
    with contextlib.suppress(AttributeError, OSError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def exit_on_sigterm() -> None:
    """SIGTERM unwinds like an exception, so that ``finally`` blocks stop the children."""

    def leave(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, leave)


class Fleet:
    """Every process of one measurement, stopped together: relays (SIGTERM, then SIGKILL) and
    simulated nodes (their stop event, then SIGTERM, then SIGKILL)."""

    def __init__(self) -> None:
        self.relays: list[subprocess.Popen[bytes]] = []
        self.nodes: list[mp.process.BaseProcess] = []
        self.stop_nodes: Event | None = None

    def stop(self) -> None:
        if self.stop_nodes is not None:
            self.stop_nodes.set()
        for relay in self.relays:
            with contextlib.suppress(ProcessLookupError):
                relay.terminate()
        for relay in self.relays:
            try:
                relay.wait(timeout=5)
            except subprocess.TimeoutExpired:
                relay.kill()
                relay.wait()
        for node in self.nodes:
            node.join(timeout=5)
            if node.exitcode is None:
                node.terminate()
                node.join(timeout=2)
            if node.exitcode is None:
                node.kill()
                node.join()


# ----------------------------------------------------------------------- a simulated node


@dataclass(frozen=True)
class Watchdog:
    """What the simulated ranks' hang watchdogs say (docs/protocol.md, ``heartbeat``) and, for
    ``--hang``, who stops where. ``judging``: the ranks' publishers judge their own stalls, as
    today's do (heartbeats carry ``stall_after_s``, the readings from half the threshold on, and
    each rank sends its own stall events: ``hang`` from the one outside the collective,
    ``collective_wait`` from each one waiting in it, said once; a ``hang`` updated every
    :data:`EPISODE_UPDATE_S`);
    else as older publishers did (``stalled_s``, then the stack and ``in_collective`` from the
    threshold on, no events), and the root relay judges them from its summaries."""

    threshold_s: float
    judging: bool = True
    culprit: int | None = None  # the rank that stops outside the collective (None: nobody stops)


class SimulatedRank:
    """One rank: a PUB socket and what a training rank sends on it, numbered as a Publisher numbers
    its messages: its ``run_start`` first, then metrics, GPU readings and heartbeats. Its snapshot
    socket answers as a Publisher's does (the ``run_start`` and its latest stall event; no metric
    history): node relays ask each rank they found after its start."""

    def __init__(self, context: zmq.Context, rank: int, local_rank: int, host: str, watchdog: Watchdog,
                 world_size: int, node: Counter[str]) -> None:
        self.rank, self.local_rank, self.host = rank, local_rank, host
        self.node = node  # what the node's ranks sent, by type, and dropped
        self.watchdog, self.world_size = watchdog, world_size
        self.pub = context.socket(zmq.PUB)
        self.pub.sndhwm = PUBLISHER_HWM
        self.pub.linger = 0
        self.pub.bind("tcp://127.0.0.1:*")
        self.snapshot_socket = snapshot_gate.snapshot_socket(context)
        self.snapshot_socket.bind("tcp://127.0.0.1:*")
        self.gate = snapshot_gate.SnapshotGate()
        self.endpoint = self.pub.last_endpoint.decode()
        self.snapshot = self.snapshot_socket.last_endpoint.decode()
        self.started = time.time()
        self.seq = self.step = self.dropped = 0
        self.sent: Counter[str] = Counter()
        self.random = random.Random(rank)
        self.kept: dict[str, bytes] = {}  # for snapshot replies: the run_start, the latest stall event
        self.last_step_at = time.monotonic()
        self.stopped = False  # its training thread stopped (--hang)
        self.said: tuple[float, int] | None = None  # its stall event: when last sent, its count

    def register(self) -> Path:
        return register(run=RUN, rank=self.rank, host=self.host, machine=machine_name(), pid=os.getpid(),
                        pub=self.endpoint, snapshot=self.snapshot, record=None, started=self.started)

    def send(self, msg_type: str, **body: Any) -> None:
        message = make_message(msg_type, run=RUN, rank=self.rank, host=self.host, ts=time.time(),
                               seq=self.seq, **body)
        self.seq += 1
        frame = encode(message)
        if msg_type in ("run_start", "event"):
            self.kept[msg_type] = frame
        try:
            self.pub.send(frame, zmq.NOBLOCK)
            self.sent[msg_type] += 1
            self.node[msg_type] += 1
        except zmq.Again:
            self.dropped += 1
            self.node["dropped"] += 1

    def run_start(self) -> None:
        self.send("run_start", config={"lr": 3e-4, "batch_size": 32}, seed=self.rank, argv=["train.py"],
                  cwd="/work", pid=os.getpid(), world_size=self.world_size, versions={"python": "3.11"},
                  gpu_source="simulated")

    def serve(self) -> None:
        """Answer a snapshot request, as a Publisher does (metered by the same gate)."""
        snapshot_gate.serve_requests(self.snapshot_socket, self.gate,
                                     lambda: (list(self.kept.values()), self.seq - 1))

    def metrics(self) -> None:
        if self.stopped:
            return
        self.step += 1
        self.last_step_at = time.monotonic()
        step_time = 0.1 * self.random.uniform(0.95, 1.05)
        values = {"loss": 2.5 * math.exp(-self.step / 5_000) + self.random.gauss(0, 0.02), "lr": 3e-4,
                  "step_time": step_time, "samples_per_s": 32 / step_time,
                  "data_time": self.random.uniform(0.001, 0.004)}
        self.send("metrics", step=self.step, metrics=wire_numbers(values))

    def gpu(self) -> None:
        device = {"index": self.local_rank, "name": "Simulated GPU",
                  "uuid": f"GPU-{self.host}-{self.local_rank}", "util": self.random.uniform(85, 100),
                  "mem_used": int(self.random.uniform(60, 70) * GIB), "mem_total": 80 * GIB,
                  "temp_c": self.random.uniform(60, 75),
                  "power_w": self.random.uniform(500, 650), "power_limit_w": 700.0, "sm_clock_mhz": 1980,
                  "throttle": [], "ecc_errors": 0}
        self.send("gpu", step=self.step, simulated=True, devices=[device])

    def heartbeat(self) -> None:
        stats = {"sent": self.sent.total(), "dropped": self.dropped, "queued": 0, "recorded": 0,
                 "snapshots": self.gate.served, "snapshots_refused": self.gate.refused,
                 "bad_requests": self.gate.bad}
        fields = self.watchdog_fields()
        self.send("heartbeat", step=self.step, snapshot=self.snapshot, stats=stats, **fields)
        self.say_stall(fields)

    def watchdog_fields(self) -> dict[str, Any]:
        """What its hang watchdog adds to a heartbeat: the stack of a stopped rank, from half the
        threshold on (a judging publisher, with its readings: no CPU, no I/O, one place) or from
        the threshold on (an older one)."""
        watchdog = self.watchdog
        stalled = time.monotonic() - self.last_step_at
        fields: dict[str, Any] = {"stalled_s": round(stalled, 3)}
        if watchdog.judging:
            fields["stall_after_s"] = watchdog.threshold_s
        read_from = (stall.CAPTURE_FROM if watchdog.judging else 1.0) * watchdog.threshold_s
        if self.stopped and stalled >= read_from:
            outside = self.rank == watchdog.culprit
            fields |= {"stack": list(FETCHING if outside else WAITING), "in_collective": not outside}
            if watchdog.judging:
                fields |= {"cpu_share": 0.0, "io_bytes_per_s": 0, "same_place": True}
        return fields

    def say_stall(self, fields: dict[str, Any]) -> None:
        """A judging publisher's own stall event (publisher/detectors/stall_events.py): ``hang`` from
        the rank outside the collective, updated while it lasts; ``collective_wait`` from one waiting
        in it, said once."""
        verdict = stall.judge(fields)
        now = time.monotonic()
        recent = self.said is not None and (verdict.state == stall.WAITING
                                            or now - self.said[0] < EPISODE_UPDATE_S)
        if not (self.watchdog.judging and verdict.stalled) or recent:
            return
        count = self.said[1] + 1 if self.said else 1
        self.said = (now, count)
        if verdict.state == stall.WAITING:
            kind, severity = "collective_wait", "info"
            text = (f"rank {self.rank} waits {verdict.stalled_s:.0f} s in {verdict.innermost}, called from "
                    f"{verdict.where}: another rank has not joined the collective; this rank is not stuck "
                    "itself")
        else:
            kind, severity = "hang", verdict.severity() or "warning"
            text = (f"rank {self.rank} stuck for {verdict.stalled_s:.0f} s in {verdict.where}: blocked "
                    f"(0% CPU, no I/O, in one place); rank {self.rank} is outside any collective, so the "
                    "other ranks wait for it in their next one")
        details = {"state": verdict.state, "stalled_s": round(verdict.stalled_s, 1),
                   "threshold_s": verdict.threshold_s, "where": verdict.where, "innermost": verdict.innermost,
                   "in_collective": verdict.in_collective, "cpu_share": 0.0, "io_bytes_per_s": 0,
                   "same_place": True, "rank": self.rank, "world_size": self.world_size, "step": self.step,
                   "stack": list(verdict.stack),
                   "likely_causes": ["another rank is late, stuck or gone",
                                     "ranks call different collectives",
                                     "a network or NCCL failure between the nodes"]}
        self.send("event", step=self.step, id=f"{self.rank}-stall", kind=kind, severity=severity,
                  message=text, details=details, count=count)


@dataclass(frozen=True)
class NodeSpec:
    index: int
    ranks: int
    rate: float  # steps a second per rank
    runtime: Path
    watchdog: Watchdog
    world_size: int

    @property
    def host(self) -> str:
        return f"node{self.index}"


#: (due, order, period, send): one kind of message of one rank, due at a monotonic time.
Due = tuple[float, int, float, Callable[[], None]]


def schedule(ranks: list[SimulatedRank], rate: float, gpu: bool = True) -> list[Due]:
    """A heap: each rank's metrics, gpu (unless not ``gpu``) and heartbeat, the ranks spread over
    each period as independent trainings would be rather than sending all at once."""
    start = time.monotonic()
    events: list[Due] = []
    for rank in ranks:
        phase = rank.local_rank / len(ranks)
        sends = [(1 / rate, rank.metrics), (HEARTBEAT_PERIOD_S, rank.heartbeat)]
        if gpu:
            sends.append((GPU_PERIOD_S, rank.gpu))
        for period, action in sends:
            events.append((start + phase * period, len(events), period, action))
    heapq.heapify(events)
    return events


@dataclass
class HangSignal:
    """``--hang``: set by the benchmark to stop the ranks (the culprit outside the collective, the
    others in it); the culprit's node writes the wall time of its last step. The ranks send no GPU
    readings then (a hang is judged from steps and heartbeats), send what is due within
    :data:`HANG_SLACK_S` in one wake-up, and answer snapshot requests every :data:`HANG_SERVE_S`
    (a relay asks once, when it finds them): the most ranks on this machine."""

    stop: Event
    last_step: Any  # a shared double


HANG_SERVE_S = 0.5
HANG_SLACK_S = 0.05


def send_until(stop: Event, ranks: list[SimulatedRank], rate: float, counts: Any,
               hang: HangSignal | None = None) -> None:
    """Send each message when it is due until ``stop``, and answer snapshot requests every
    :data:`~publisher.wire.snapshot_gate.SERVE_INTERVAL_S`; a sender that falls behind skips ahead
    (a slowed training sends less) rather than bursting. ``counts`` (shared): messages sent of
    each type of :data:`PUBLISHED`, then those dropped (the PUB's queue was full). Once ``hang``
    is set, every rank stops stepping (its heartbeats go on)."""
    events = schedule(ranks, rate, gpu=hang is None)
    serve_every = snapshot_gate.SERVE_INTERVAL_S if hang is None else HANG_SERVE_S
    slack = 0.0 if hang is None else HANG_SLACK_S  # what is due this soon goes now, in one wake-up
    next_serve = 0.0
    while not stop.is_set():
        now = time.monotonic()
        if hang is not None and hang.stop.is_set() and not ranks[0].stopped:
            for rank in ranks:
                rank.stopped = True
                if rank.rank == rank.watchdog.culprit:
                    hang.last_step.value = time.time() - (now - rank.last_step_at)
        while events[0][0] <= now + slack:
            due, order, period, action = heapq.heappop(events)
            action()
            heapq.heappush(events, (max(due + period, now), order, period, action))
        if now >= next_serve:
            next_serve = now + serve_every
            for rank in ranks:
                rank.serve()
        node = ranks[0].node
        for index, msg_type in enumerate(PUBLISHED):
            counts[index] = node[msg_type]
        counts[-1] = node["dropped"]
        time.sleep(max(0.0, min(events[0][0] - time.monotonic(), next_serve - time.monotonic(), 0.1)))


def run_node(spec: NodeSpec, counts: Any, ready: Event, stop: Event, hang: HangSignal | None = None) -> None:
    """A simulated node (the body of its process): its ranks, registered in its runtime folder,
    each having sent its ``run_start`` before any relay can hear it."""
    die_with_parent()
    exit_on_sigterm()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the benchmark's: it stops the nodes
    os.environ["TUIMON_RUNTIME_DIR"] = str(spec.runtime)
    os.environ[ENV_HOST] = spec.host
    context = zmq.Context()
    paths: list[Path] = []
    try:
        node: Counter[str] = Counter()
        ranks = [SimulatedRank(context, spec.index * spec.ranks + local, local, host_name(), spec.watchdog,
                               spec.world_size, node)
                 for local in range(spec.ranks)]
        for rank in ranks:
            rank.run_start()
        paths = [rank.register() for rank in ranks]
        ready.set()
        send_until(stop, ranks, spec.rate, counts, hang)
    finally:
        for path in paths:
            unregister(path)
        context.destroy(linger=0)


# ------------------------------------------------------------------------------------ relays


def start_relay(
    fleet: Fleet, arguments: list[str], log: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """``tuimon relay ARGUMENTS`` in its own process, its output in ``log``."""
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "tuimon.cli", "relay", *arguments], stdout=out,
                                   stderr=subprocess.STDOUT, env=env, cwd=REPO, preexec_fn=die_with_parent)
    fleet.relays.append(process)
    return process


def relay_env(runtime: Path, host: str) -> dict[str, str]:
    env = {**os.environ, "TUIMON_RUNTIME_DIR": str(runtime), ENV_HOST: host}
    env.pop("TUIMON_RELAY", None)
    return env


def started(process: subprocess.Popen[bytes], log: Path, timeout_s: float = 60.0) -> bool:
    """Whether the relay said where viewers connect (False: it exited, e.g. its port was taken)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "viewers connect to" in log.read_text(errors="replace"):
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.05)
    raise RuntimeError(f"relay did not start within {timeout_s:.0f} s: {log.read_text(errors='replace')}")


def start_root(fleet: Fleet, folder: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """A root relay on a port P with P+1 free too (it binds both): tried on random ports below the
    ephemeral range until one pair is free, so no other process can take it in between."""
    log = folder / "root.log"
    for _ in range(20):
        address = f"tcp://127.0.0.1:{random.randrange(20_000, 32_000)}"
        process = start_relay(fleet, ["--root", "--listen", address], log, relay_env(folder / "root", "root"))
        if started(process, log):
            return address, process
        fleet.relays.remove(process)
    raise RuntimeError(f"no root relay could listen: {log.read_text(errors='replace')}")


# ------------------------------------------------------------------------------------ viewer


@dataclass(frozen=True)
class HeardEvent:
    """An event as the viewer at the root heard it: when (this process's wall clock), about whom,
    from whom (``by``: a relay; None: the rank's own publisher), how loud, its size."""

    at: float
    kind: str
    severity: str
    rank: int
    host: str
    by: str | None
    message: str
    size: int


@dataclass
class Tally:
    """What one SUB received in the window: the publishers' messages, their delays and ``seq``
    gaps; and, apart, the messages the relays made (by type, events by kind)."""

    received: int = 0
    lost: int = 0
    malformed: int = 0
    delays_s: dict[str, list[float]] = field(default_factory=dict)  # by host
    made_by_relays: Counter[str] = field(default_factory=Counter)
    findings: Counter[str] = field(default_factory=Counter)


class Viewer:
    """A SUB socket subscribed to ``types`` (None: everything); tallies what it receives while
    ``counting``. What a relay made (its ``relay`` beat, a node's ``summary``, an ``event`` about the
    job: ``numbered_by_sender`` is false) is numbered by that relay, not by the rank its envelope
    names, and is counted apart: it is not part of what was offered."""

    def __init__(self, context: zmq.Context, addresses: list[str], types: tuple[str, ...] | None) -> None:
        self.sub = context.socket(zmq.SUB)
        self.sub.rcvhwm = VIEWER_HWM
        self.sub.linger = 0
        for topic in [subscription(msg_type) for msg_type in types] if types else [EVERYTHING]:
            self.sub.subscribe(topic)
        for address in addresses:
            self.sub.connect(address)
        self.last_seq: dict[tuple[str, str, int], int] = {}
        self.hosts: set[str] = set()
        self.counting = False
        self.gaps_are_losses = types is None  # a SUB that filters sees gaps where it filtered
        self.tally = Tally()
        self.events: list[HeardEvent] = []  # every event heard, counting or not
        self.starts: set[int] = set()  # ranks whose run_start was heard

    def drain(self) -> None:
        while True:
            try:
                frame = self.sub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.take(frame, time.time())

    def take(self, frame: bytes, now: float) -> None:
        try:
            message = decode(frame)
        except ProtocolError:
            if self.counting:
                self.tally.malformed += 1
            return
        if message["type"] == "event":
            self.events.append(HeardEvent(now, message["kind"], message["severity"], message["rank"],
                                          message["host"], message.get("by"), message["message"], len(frame)))
        elif message["type"] == "run_start":
            self.starts.add(message["rank"])
        if not numbered_by_sender(message):
            self.hosts.add(message["host"])
            if self.counting:
                self.tally.made_by_relays[message["type"]] += 1
                if message["type"] == "event":
                    self.tally.findings[message.get("kind", "?")] += 1
                if message["type"] == "summary":  # what the job view draws: from its relay to here
                    self.tally.delays_s.setdefault(message["host"], []).append(now - message["ts"])
            return
        sender = (message["host"], message["run"], message["rank"])
        last = self.last_seq.get(sender)
        self.last_seq[sender] = message["seq"]
        self.hosts.add(message["host"])
        if not self.counting:
            return
        self.tally.received += 1
        self.tally.delays_s.setdefault(message["host"], []).append(now - message["ts"])
        if self.gaps_are_losses and last is not None and message["seq"] > last + 1:
            self.tally.lost += message["seq"] - last - 1


def pump(viewers: list[Viewer], seconds: float) -> None:
    """Read every viewer's socket for ``seconds``."""
    poller = zmq.Poller()
    by_socket = {viewer.sub: viewer for viewer in viewers}
    for viewer in viewers:
        poller.register(viewer.sub, zmq.POLLIN)
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        for sock, _ in poller.poll(int(min(left, 0.05) * 1000) + 1):
            by_socket[sock].drain()


def wait_for_hosts(viewers: list[tuple[Viewer, set[str]]], timeout_s: float, logs: list[Path]) -> None:
    """Read until each viewer has heard from each of its hosts (the tree is connected)."""
    deadline = time.monotonic() + timeout_s
    while any(not hosts <= viewer.hosts for viewer, hosts in viewers):
        if time.monotonic() > deadline:
            missing = sorted(set().union(*(hosts - viewer.hosts for viewer, hosts in viewers)))
            tails = "".join(log.read_text(errors="replace")[-300:] for log in logs[:3])
            raise RuntimeError(f"no message from {', '.join(missing[:8])} after {timeout_s:.0f} s; {tails}")
        pump([viewer for viewer, _ in viewers], 0.2)


# ------------------------------------------------------------------------------ measurement


@dataclass(frozen=True)
class Setup:
    """One measurement: ``nodes`` simulated nodes behind a relay tree (``relayed``), or read directly."""

    nodes: int
    ranks: int  # a node
    rate: float  # metrics a second a rank
    relayed: bool
    types: tuple[str, ...] | None  # what the viewers subscribe to (None: everything)
    warm_up: float
    seconds: float


@dataclass
class Row:
    """One measurement's figures over its window."""

    setup: Setup
    seconds: float
    offered: int  # of the types the viewer subscribed to
    pub_dropped: int
    at_viewer: Tally  # at the root, or at the publishers for the baseline
    direct: Tally | None  # node 0 read directly in the same window (relayed rows only)
    node_relay_cpu: list[float]  # % of one core, per node relay
    node_relay_main: list[float]  # the same, their main threads only
    root_cpu: float | None
    root_main: float | None
    publishers_cpu: float  # % of one core, mean per node process
    machine_cpu: float  # % of all cores


def cpu_seconds(process: psutil.Process) -> tuple[float, float]:
    """CPU seconds (user + system) of the whole process, and of its main thread."""
    times = process.cpu_times()
    main = next((t.user_time + t.system_time for t in process.threads() if t.id == process.pid), 0.0)
    return times.user + times.system, main


def start_nodes(fleet: Fleet, folder: Path, setup: Setup, watchdog: Watchdog | None = None,
                hang: HangSignal | None = None) -> list[Any]:
    """The simulated node processes, each registered and sending; their shared counters (see
    :func:`send_until`). Forked before this process opens any ZeroMQ socket (a ZeroMQ context does
    not survive a fork). ``watchdog``: what their heartbeats say (by default: judging publishers
    at the threshold of their step rate, nobody stopping)."""
    context = mp.get_context("fork")
    fleet.stop_nodes = context.Event()
    watchdog = watchdog or Watchdog(stall.threshold_s(1 / setup.rate))
    counters = []
    for index in range(setup.nodes):
        spec = NodeSpec(index, setup.ranks, setup.rate, folder / f"node{index}", watchdog,
                        setup.nodes * setup.ranks)
        counts, ready = context.RawArray("q", len(PUBLISHED) + 1), context.Event()
        process = context.Process(target=run_node, args=(spec, counts, ready, fleet.stop_nodes, hang),
                                  name=f"tuimon-scale-{spec.host}", daemon=True)
        process.start()
        fleet.nodes.append(process)
        counters.append((counts, ready))
    deadline = time.monotonic() + 30 + setup.nodes  # they start together, sharing the machine
    for (_, ready), process in zip(counters, fleet.nodes, strict=True):
        if not ready.wait(timeout=max(deadline - time.monotonic(), 0.0)):
            raise RuntimeError(f"simulated {process.name} did not start (exit code {process.exitcode})")
    return [counts for counts, _ in counters]


def start_tree(fleet: Fleet, folder: Path, nodes: int) -> tuple[str, subprocess.Popen[bytes]]:
    """The root relay, and one node relay a node, each finding its node's ranks in the registry."""
    root, root_process = start_root(fleet, folder)
    for index in range(nodes):
        start_relay(fleet, ["--upstream", root], folder / f"node{index}.log",
                    relay_env(folder / f"node{index}", f"node{index}"))
    return root, root_process


def measure(setup: Setup) -> Row:
    """Start every process, wait until the viewers hear every node, warm up, measure a window."""
    fleet = Fleet()
    with tempfile.TemporaryDirectory(prefix="tuimon-scale-") as tmp:
        folder = Path(tmp)
        context: zmq.Context | None = None
        try:
            counters = start_nodes(fleet, folder, setup)
            root, root_process = start_tree(fleet, folder, setup.nodes) if setup.relayed else (None, None)
            context = zmq.Context()
            node0 = [entry.pub for entry in live_entries(folder / "node0")]
            # Node 0's publishers as they are (the job view's types are mostly made by relays).
            direct = Viewer(context, node0, None if setup.types is None else PUBLISHED)
            waits = [(direct, {"node0"})]
            if root is not None:
                waits.append((Viewer(context, [root], setup.types), {f"node{i}" for i in range(setup.nodes)}))
            wait_for_hosts(waits, timeout_s=20 + setup.nodes, logs=sorted(folder.glob("*.log")))
            viewers = [viewer for viewer, _ in waits]
            pump(viewers, setup.warm_up)
            return window(setup, fleet, counters, viewers, root_process)
        finally:
            if context is not None:
                context.destroy(linger=0)
            fleet.stop()


def window(setup: Setup, fleet: Fleet, counters: list[Any], viewers: list[Viewer],
           root_process: subprocess.Popen[bytes] | None) -> Row:
    """The measurement window, every message tallied. The senders' counters are read right at its
    edges; each process's CPU time is read just outside them, each over its own interval.
    ``viewers``: node 0 read directly, then (relayed) the root."""
    root = psutil.Process(root_process.pid) if root_process is not None else None
    node_relays = [psutil.Process(p.pid) for p in fleet.relays if p is not root_process]
    publishers = [psutil.Process(p.pid) for p in fleet.nodes]
    watched = [*node_relays, *publishers, *([root] if root else [])]
    cpu_before = {process.pid: (time.monotonic(), *cpu_seconds(process)) for process in watched}
    psutil.cpu_percent(None)
    sent_before = [list(counts) for counts in counters]
    began = time.monotonic()
    for viewer in viewers:
        viewer.counting = True
    pump(viewers, setup.seconds)
    for viewer in viewers:
        viewer.counting = False
    sent_after = [list(counts) for counts in counters]
    elapsed = time.monotonic() - began
    machine = psutil.cpu_percent(None)
    cpu = {process.pid: cpu_percent(cpu_before[process.pid], (time.monotonic(), *cpu_seconds(process)))
           for process in watched}
    sent = [sum(after[i] - before[i] for after, before in zip(sent_after, sent_before, strict=True))
            for i in range(len(PUBLISHED) + 1)]
    return Row(
        setup=setup, seconds=elapsed,
        offered=sum(sent[i] for i, msg_type in enumerate(PUBLISHED)
                    if setup.types is None or msg_type in setup.types),
        pub_dropped=sent[-1],
        at_viewer=viewers[-1].tally, direct=viewers[0].tally if root else None,
        node_relay_cpu=[cpu[p.pid][0] for p in node_relays],
        node_relay_main=[cpu[p.pid][1] for p in node_relays],
        root_cpu=cpu[root.pid][0] if root else None,
        root_main=cpu[root.pid][1] if root else None,
        publishers_cpu=statistics.fmean(cpu[p.pid][0] for p in publishers),
        machine_cpu=machine,
    )


def cpu_percent(before: tuple[float, float, float], after: tuple[float, float, float]) -> tuple[float, float]:
    """% of one core between two (monotonic time, process CPU s, main thread CPU s) readings."""
    seconds = after[0] - before[0]
    return 100 * (after[1] - before[1]) / seconds, 100 * (after[2] - before[2]) / seconds


# ------------------------------------------------------------------------------------ report


def delays_ms(tally: Tally | None, host: str | None = None) -> tuple[float, float]:
    """p50 and p95 of the delays in ms, of every sender or of ``host``'s."""
    if tally is None:
        return math.nan, math.nan
    delays = tally.delays_s.get(host, []) if host else [d for ds in tally.delays_s.values() for d in ds]
    if not delays:
        return math.nan, math.nan
    return statistics.median(delays) * 1e3, p95(delays) * 1e3


def misses(row: Row) -> list[str]:
    """The targets this row misses, and any loss (the root's target is judged on the fit, below)."""
    found = []
    if delays_ms(row.at_viewer)[1] > TARGET_DELAY_P95_S * 1e3:
        found.append(f"delay p95 > {TARGET_DELAY_P95_S:g} s")
    busiest = max(row.node_relay_cpu, default=0.0)
    if row.setup.ranks == TARGET_NODE_RANKS and busiest > TARGET_NODE_RELAY_CPU:
        found.append(f"node relay > {TARGET_NODE_RELAY_CPU:g} %")
    lost = row.at_viewer.lost + row.pub_dropped + row.at_viewer.malformed
    if lost:
        found.append(f"{lost:,} lost")
    if row.at_viewer.received < 0.99 * row.offered:
        found.append(f"delivered {row.at_viewer.received / row.offered:.1%}")
    return found


def root_at_target(tree: list[Row]) -> tuple[float, str]:
    """The root's CPU for 512 nodes: a straight line through the sizes measured (its fixed cost
    apart from its cost per node), or in proportion when only one size was measured."""
    nodes = [row.setup.nodes for row in tree]
    cpu = [row.root_cpu or 0.0 for row in tree]
    if len(set(nodes)) >= 2:
        fit = statistics.linear_regression(nodes, cpu)
        return fit.intercept + fit.slope * TARGET_ROOT_NODES, (
            f"{fit.intercept:.2f} % + {fit.slope:.3f} % a node, fitted on {len(set(nodes))} sizes")
    return cpu[-1] / nodes[-1] * TARGET_ROOT_NODES, (
        f"in proportion to {nodes[-1]} nodes, fixed cost included: an upper bound; measure two sizes")


HEADER = (f"{'':<7}{'nodes':>6}{'ranks':>6}{'offered/s':>10}{'deliv/s':>9}{'deliv %':>8}{'lost':>6}"
          f"{'delay ms p50/p95':>18}{'node0 p50/p95':>15}{'direct p50/p95':>16}{'x direct':>9}"
          f"{'node relay % (main)':>20}{'root % (main)':>14}{'pubs %':>8}{'machine %':>10}  misses")


def pair(values: tuple[float, float], width: int) -> str:
    """``p50/p95`` right-aligned on the slash; ``-`` when not measured."""
    if math.isnan(values[0]):
        return f"{'-':>{width - 8}}{'':8}"
    return f"{values[0]:>{width - 8}.2f}/{values[1]:<7.2f}"


def format_row(row: Row) -> str:
    offered, delivered = row.offered / row.seconds, row.at_viewer.received / row.seconds
    everyone = delays_ms(row.at_viewer)
    node0 = delays_ms(row.at_viewer, "node0") if row.direct else (math.nan, math.nan)
    direct = delays_ms(row.direct, "node0")
    setup = row.setup
    ratio = f"{node0[0] / direct[0]:>9.2f}" if row.direct else f"{'-':>9}"
    relay_cpu = (f"{statistics.fmean(row.node_relay_cpu):.2f}/{max(row.node_relay_cpu):.2f}"
                 f" ({statistics.fmean(row.node_relay_main):.1f})" if row.node_relay_cpu else "-")
    root_cpu = f"{row.root_cpu:.2f} ({row.root_main:.1f})" if row.root_cpu is not None else "-"
    lost = "n/a" if setup.types else f"{row.at_viewer.lost + row.pub_dropped:,}"
    share = f"{row.at_viewer.received / row.offered:.1%}" if row.offered else "n/a"  # job view: none offered
    return (f"{'tree' if setup.relayed else 'direct':<7}{setup.nodes:>6}{setup.nodes * setup.ranks:>6}"
            f"{offered:>10,.0f}{delivered:>9,.0f}{share:>8}"
            f"{lost:>6}{pair(everyone, 18)}{pair(node0, 15)}"
            f"{pair(direct, 16)}{ratio}{relay_cpu:>20}{root_cpu:>14}{row.publishers_cpu:>8.2f}"
            f"{row.machine_cpu:>10.0f}  {'; '.join(misses(row)) or '-'}")


def summary(rows: list[Row]) -> list[str]:
    """The verdicts against the targets, and what the relays added to the stream."""
    tree = [row for row in rows if row.setup.relayed]
    if not tree:
        return []
    root, how = root_at_target(tree)
    busiest = max(max(row.node_relay_cpu) for row in tree)
    delay = max(delays_ms(row.at_viewer)[1] for row in tree)
    lines = [
        f"root at {TARGET_ROOT_NODES} nodes: {root:.1f} % of a core ({how}); target <= {TARGET_ROOT_CPU:g}"
        + ("" if root <= TARGET_ROOT_CPU else "  MISSED"),
        f"busiest node relay: {busiest:.2f} % of a core; target <= {TARGET_NODE_RELAY_CPU:g} with "
        f"{TARGET_NODE_RANKS} ranks" + ("" if busiest <= TARGET_NODE_RELAY_CPU else "  MISSED"),
        f"worst delay p95 through the tree: {delay:.1f} ms; target <= {TARGET_DELAY_P95_S * 1e3:.0f}"
        + ("" if delay <= TARGET_DELAY_P95_S * 1e3 else "  MISSED"),
    ]
    for row in tree:
        made = ", ".join(f"{kind} {count / row.seconds:.1f}/s" for kind, count in
                         sorted(row.at_viewer.made_by_relays.items()))
        kinds = ", ".join(f"{kind} x{count}" for kind, count in sorted(row.at_viewer.findings.items()))
        lines.append(f"{row.setup.nodes} nodes: the relays added {made or 'nothing'}"
                     + (f"; events: {kinds}" if kinds else ""))
    return lines


# ------------------------------------------------------------------------------------ a hang


@dataclass
class HangResult:
    """What the root said while the job hung: the events heard after the ranks stopped."""

    setup: Setup
    watchdog: Watchdog
    last_step: float  # wall time of the culprit's last step
    events: list[HeardEvent]
    starts: int  # ranks whose run_start reached the root
    watched_s: float
    root_cpu: float
    node_relay_cpu: list[float]
    machine_cpu: float

    @property
    def culprit(self) -> int:
        assert self.watchdog.culprit is not None
        return self.watchdog.culprit

    @property
    def host(self) -> str:
        return f"node{self.culprit // self.setup.ranks}"

    def named(self) -> HeardEvent | None:
        """The first ``hang`` about the culprit (its own, or a relay's)."""
        return next((e for e in self.events if e.kind == "hang" and e.rank == self.culprit), None)

    def relay_word(self) -> HeardEvent | None:
        """The first thing a relay said about the culprit."""
        return next((e for e in self.events if e.by and e.rank == self.culprit), None)

    def blamed(self) -> list[int]:
        """The ranks of every warning or critical event heard."""
        return sorted({e.rank for e in self.events if e.severity in ("warning", "critical")})


def measure_hang(setup: Setup, watchdog: Watchdog, watch_s: float) -> HangResult:
    """Start every process, wait until the root hears every node, warm up, then stop every rank
    (the culprit outside the collective, the others in it) and read the root for ``watch_s``."""
    fleet = Fleet()
    forks = mp.get_context("fork")
    hang = HangSignal(forks.Event(), forks.Value("d", 0.0))
    with tempfile.TemporaryDirectory(prefix="tuimon-scale-") as tmp:
        folder = Path(tmp)
        context: zmq.Context | None = None
        try:
            began = time.monotonic()
            start_nodes(fleet, folder, setup, watchdog, hang)
            print(f"  {setup.nodes} simulated nodes up after {time.monotonic() - began:.0f} s",
                  file=sys.stderr)
            root, root_process = start_tree(fleet, folder, setup.nodes)
            context = zmq.Context()
            viewer = Viewer(context, [root], JOB_TYPES)
            hosts = {f"node{i}" for i in range(setup.nodes)}
            logs = sorted(folder.glob("*.log"))
            wait_for_hosts([(viewer, hosts)], timeout_s=60 + 3 * setup.nodes, logs=logs)
            print(f"  every node heard at the root after {time.monotonic() - began:.0f} s", file=sys.stderr)
            pump([viewer], setup.warm_up)
            relays = [psutil.Process(p.pid) for p in fleet.relays]
            before = {p.pid: (time.monotonic(), *cpu_seconds(p)) for p in relays}
            psutil.cpu_percent(None)
            heard = len(viewer.events)
            hang.stop.set()
            pump([viewer], watch_s)
            machine = psutil.cpu_percent(None)
            cpu = {p.pid: cpu_percent(before[p.pid], (time.monotonic(), *cpu_seconds(p)))[0] for p in relays}
            node_relays = [cpu[p.pid] for p in relays if p.pid != root_process.pid]
            return HangResult(setup, watchdog, hang.last_step.value, viewer.events[heard:],
                              len(viewer.starts), watch_s, cpu[root_process.pid], node_relays, machine)
        finally:
            if context is not None:
                context.destroy(linger=0)
            fleet.stop()


def hang_report(result: HangResult) -> list[str]:
    """Who was named, when, by whom; who else was blamed; what it cost the root."""
    setup, watchdog = result.setup, result.watchdog
    ranks = setup.nodes * setup.ranks
    kind = "judging publishers (today's)" if watchdog.judging else "older publishers (the root judges)"
    lines = [f"hang: {ranks:,} ranks ({setup.nodes} nodes x {setup.ranks}), {kind}, threshold "
             f"{watchdog.threshold_s:g} s; rank {result.culprit} ({result.host}) stops in fetch_batch "
             f"(data.py:4), the others wait in all_reduce"]

    def said(event: HeardEvent) -> str:
        who = f"the relay {event.by}" if event.by else "its own publisher"
        return (f"after {event.at - result.last_step:.1f} s by {who}: {event.kind} {event.severity} "
                f"\"{event.message[:140]}\"")

    named = result.named()
    if named is None:
        lines.append(f"named: NOBODY within {result.watched_s:g} s  MISSED")
    else:
        late = named.at - result.last_step > TARGET_NAMED_S
        lines.append(f"named: rank {named.rank} on {named.host} {said(named)}; target <= {TARGET_NAMED_S:g} s"
                     + ("  MISSED" if late or named.rank != result.culprit else ""))
    word = result.relay_word()
    lines.append(f"the root's word on it: {said(word) if word else 'none'}")
    blamed = result.blamed()
    lines.append("blamed (warning or critical): " + (f"rank {blamed[0]} only" if blamed == [result.culprit]
                                                     else ", ".join(map(str, blamed)) or "nobody"))
    kinds = Counter(e.kind for e in result.events)
    size = sum(e.size for e in result.events)
    lines.append(f"run_starts at the root: {result.starts:,} of {ranks:,}; events at the root in "
                 f"{result.watched_s:g} s: {len(result.events):,} ({size / result.watched_s / 1e6:.2f} MB/s: "
                 + ", ".join(f"{k} {n:,}" for k, n in sorted(kinds.items())) + ")")
    relays = result.node_relay_cpu
    lines.append(f"CPU during the hang, % of one core: root {result.root_cpu:.1f}, node relays "
                 f"{statistics.fmean(relays):.1f} mean / {max(relays):.1f} max; machine "
                 f"{result.machine_cpu:.0f} % of all cores")
    return lines


def run_hang(args: argparse.Namespace) -> int:
    nodes = int(args.nodes)
    ranks = nodes * args.ranks_per_node
    culprit = args.hang_rank if args.hang_rank is not None else ranks * 2 // 3 + 1
    if not 0 <= culprit < ranks:
        raise SystemExit(f"--hang-rank {culprit} is not a rank of {ranks}")
    watchdog = Watchdog(stall.threshold_s(1 / args.rate), args.publishers == "judging", culprit)
    setup = Setup(nodes, args.ranks_per_node, args.rate, True, JOB_TYPES, args.warm_up, args.seconds)
    print(f"{os.cpu_count()} CPUs shared by every process; {args.rate:g} steps/s a rank; the viewer at the "
          "root takes what a job view takes", flush=True)
    for line in hang_report(measure_hang(setup, watchdog, args.seconds)):
        print(line, flush=True)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--nodes", help="tree sizes (nodes), comma-separated (default 1,4,16,32; "
                        "with --hang one size, default 32)")
    parser.add_argument("--ranks-per-node", type=int, help="ranks (PUB sockets) a node (default 8; with "
                        "--hang 128)")
    parser.add_argument("--rate", type=float, help="metrics messages a second a rank (default 10; with "
                        "--hang 2: a 5 s stall threshold)")
    parser.add_argument("--view", choices=sorted(VIEWS), default="all",
                        help="what the viewers subscribe to: everything, or what a job-wide view needs")
    parser.add_argument("--warm-up", type=float, default=3.0, help="seconds before each window")
    parser.add_argument("--seconds", type=float, help="seconds of each measurement window (default 10; "
                        "with --hang, how long the root is read after the ranks stop: 15)")
    parser.add_argument("--quick", action="store_true", help="nodes 1,4, 1 s warm-up, 3 s windows (~20 s)")
    parser.add_argument("--hang", action="store_true",
                        help="instead: one rank stops outside the collective while the others wait in it; "
                        "who the root names, when, and who else it blames")
    parser.add_argument("--hang-rank", type=int, help="the rank that stops (default: two thirds in)")
    parser.add_argument("--publishers", choices=("judging", "older"), default="judging",
                        help="with --hang: the ranks judge their own stalls and say so (today's publisher), "
                        "or their heartbeats only say where they are (older ones: the root judges)")
    args = parser.parse_args(argv)
    hang = args.hang
    args.nodes = args.nodes or ("32" if hang else "1,4,16,32")
    args.ranks_per_node = args.ranks_per_node or (128 if hang else 8)
    args.rate = args.rate or (2.0 if hang else 10.0)
    args.seconds = args.seconds or (15.0 if hang else 10.0)
    if args.quick:
        args.nodes, args.warm_up, args.seconds = "1,4", 1.0, 3.0
    if hang and "," in args.nodes:
        parser.error("--hang takes one size: --nodes N")
    return args


def print_preamble(args: argparse.Namespace) -> None:
    per_rank = args.rate + 1 / GPU_PERIOD_S + 1 / HEARTBEAT_PERIOD_S
    types = VIEWS[args.view]
    print(f"{os.cpu_count()} CPUs shared by every process (numbers are provisional); {args.ranks_per_node} "
          f"ranks a node, {per_rank:g} msg/s a rank (metrics {args.rate:g}/s, gpu and heartbeat 1/s); "
          f"{args.warm_up:g} s warm-up, {args.seconds:g} s window; viewers subscribed to "
          + (", ".join(types) if types else "everything"))
    print(f"targets: delay p95 <= {TARGET_DELAY_P95_S:g} s; a node relay with "
          f"{TARGET_NODE_RANKS} ranks <= {TARGET_NODE_RELAY_CPU:g} % of one core; the root for "
          f"{TARGET_ROOT_NODES} nodes <= {TARGET_ROOT_CPU:g} % of one core")
    print("offered and delivered: the publishers' messages of the types subscribed to; delay: of every "
          "sender at the viewer; node0: node 0's messages through the tree, direct: the same read straight "
          "from its publishers in the same window, x direct: their p50 ratio; lost: seq gaps (n/a when "
          "the viewers filter) and publisher drops. CPU in % of one core (node relay: mean/max; (main): "
          "the relay's main thread, its Python work: registry scans, beats, summaries, the job watch; "
          "the rest is ZeroMQ's I/O thread and the proxy; pubs: a node process), machine: % of all cores")


def run_all(args: argparse.Namespace) -> int:
    sizes = [int(size) for size in args.nodes.split(",")]
    print_preamble(args)
    print(HEADER)
    print("-" * len(HEADER))
    rows = []
    for nodes, relayed in [(1, False), *((size, True) for size in sizes)]:
        rows.append(measure(Setup(nodes, args.ranks_per_node, args.rate, relayed, VIEWS[args.view],
                                  args.warm_up, args.seconds)))
        print(format_row(rows[-1]), flush=True)
    for line in summary(rows):
        print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    try:
        return run_hang(args) if args.hang else run_all(args)
    except KeyboardInterrupt:
        print("interrupted: every process stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
