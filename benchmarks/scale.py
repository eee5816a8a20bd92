"""How the relay tree's cost grows with the number of nodes: delivery, delay and CPU of each relay.

    python benchmarks/scale.py [--nodes 1,4,16,32] [--ranks-per-node 8] [--seconds 10] [--view all|job]
    python benchmarks/scale.py --quick

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


class SimulatedRank:
    """One rank: a PUB socket and what a training rank sends on it, numbered as a Publisher numbers
    its messages. Its snapshot socket is bound (the registry and heartbeats name it) and never read:
    the benchmark has no late joiners."""

    def __init__(self, context: zmq.Context, rank: int, local_rank: int, host: str) -> None:
        self.rank, self.local_rank, self.host = rank, local_rank, host
        self.pub = context.socket(zmq.PUB)
        self.pub.sndhwm = PUBLISHER_HWM
        self.pub.linger = 0
        self.pub.bind("tcp://127.0.0.1:*")
        self.snapshot_socket = context.socket(zmq.ROUTER)
        self.snapshot_socket.linger = 0
        self.snapshot_socket.bind("tcp://127.0.0.1:*")
        self.endpoint = self.pub.last_endpoint.decode()
        self.snapshot = self.snapshot_socket.last_endpoint.decode()
        self.started = time.time()
        self.seq = self.step = self.dropped = 0
        self.sent: Counter[str] = Counter()
        self.random = random.Random(rank)

    def register(self) -> Path:
        return register(run=RUN, rank=self.rank, host=self.host, machine=machine_name(), pid=os.getpid(),
                        pub=self.endpoint, snapshot=self.snapshot, record=None, started=self.started)

    def send(self, msg_type: str, **body: Any) -> None:
        message = make_message(msg_type, run=RUN, rank=self.rank, host=self.host, ts=time.time(),
                               seq=self.seq, **body)
        self.seq += 1
        try:
            self.pub.send(encode(message), zmq.NOBLOCK)
            self.sent[msg_type] += 1
        except zmq.Again:
            self.dropped += 1

    def metrics(self) -> None:
        self.step += 1
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
                 "snapshots": 0, "snapshots_refused": 0, "bad_requests": 0}
        self.send("heartbeat", step=self.step, snapshot=self.snapshot, stats=stats)


@dataclass(frozen=True)
class NodeSpec:
    index: int
    ranks: int
    rate: float  # steps a second per rank
    runtime: Path

    @property
    def host(self) -> str:
        return f"node{self.index}"


#: (due, order, period, send): one kind of message of one rank, due at a monotonic time.
Due = tuple[float, int, float, Callable[[], None]]


def schedule(ranks: list[SimulatedRank], rate: float) -> list[Due]:
    """A heap: each rank's metrics, gpu and heartbeat, the ranks spread over each period as
    independent trainings would be rather than sending all at once."""
    start = time.monotonic()
    events: list[Due] = []
    for rank in ranks:
        phase = rank.local_rank / len(ranks)
        for period, action in ((1 / rate, rank.metrics), (GPU_PERIOD_S, rank.gpu),
                               (HEARTBEAT_PERIOD_S, rank.heartbeat)):
            events.append((start + phase * period, len(events), period, action))
    heapq.heapify(events)
    return events


def send_until(stop: Event, ranks: list[SimulatedRank], rate: float, counts: Any) -> None:
    """Send each message when it is due until ``stop``; a sender that falls behind skips ahead (a
    slowed training sends less) rather than bursting. ``counts`` (shared): messages sent of each
    type of :data:`PUBLISHED`, then those dropped (the PUB's queue was full)."""
    events = schedule(ranks, rate)
    while not stop.is_set():
        now = time.monotonic()
        while events[0][0] <= now:
            due, order, period, action = heapq.heappop(events)
            action()
            heapq.heappush(events, (max(due + period, now), order, period, action))
        for index, msg_type in enumerate(PUBLISHED):
            counts[index] = sum(rank.sent[msg_type] for rank in ranks)
        counts[-1] = sum(rank.dropped for rank in ranks)
        time.sleep(max(0.0, min(events[0][0] - time.monotonic(), 0.1)))


def run_node(spec: NodeSpec, counts: Any, ready: Event, stop: Event) -> None:
    """A simulated node (the body of its process): its ranks, registered in its runtime folder."""
    die_with_parent()
    exit_on_sigterm()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the benchmark's: it stops the nodes
    os.environ["TUIMON_RUNTIME_DIR"] = str(spec.runtime)
    os.environ[ENV_HOST] = spec.host
    context = zmq.Context()
    paths: list[Path] = []
    try:
        ranks = [SimulatedRank(context, spec.index * spec.ranks + local, local, host_name())
                 for local in range(spec.ranks)]
        paths = [rank.register() for rank in ranks]
        ready.set()
        send_until(stop, ranks, spec.rate, counts)
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


def started(process: subprocess.Popen[bytes], log: Path, timeout_s: float = 15.0) -> bool:
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


def start_nodes(fleet: Fleet, folder: Path, setup: Setup) -> list[Any]:
    """The simulated node processes, each registered and sending; their shared counters (see
    :func:`send_until`). Forked before this process opens any ZeroMQ socket (a ZeroMQ context does
    not survive a fork)."""
    context = mp.get_context("fork")
    fleet.stop_nodes = context.Event()
    counters = []
    for index in range(setup.nodes):
        spec = NodeSpec(index, setup.ranks, setup.rate, folder / f"node{index}")
        counts, ready = context.RawArray("q", len(PUBLISHED) + 1), context.Event()
        process = context.Process(target=run_node, args=(spec, counts, ready, fleet.stop_nodes),
                                  name=f"tuimon-scale-{spec.host}", daemon=True)
        process.start()
        fleet.nodes.append(process)
        if not ready.wait(timeout=30):
            raise RuntimeError(f"simulated {spec.host} did not start (exit code {process.exitcode})")
        counters.append(counts)
    return counters


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--nodes", default="1,4,16,32", help="tree sizes (nodes), comma-separated")
    parser.add_argument("--ranks-per-node", type=int, default=8, help="ranks (PUB sockets) a node")
    parser.add_argument("--rate", type=float, default=10.0, help="metrics messages a second a rank")
    parser.add_argument("--view", choices=sorted(VIEWS), default="all",
                        help="what the viewers subscribe to: everything, or what a job-wide view needs")
    parser.add_argument("--warm-up", type=float, default=3.0, help="seconds before each window")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of each measurement window")
    parser.add_argument("--quick", action="store_true", help="nodes 1,4, 1 s warm-up, 3 s windows (~20 s)")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.warm_up, args.seconds = "1,4", 1.0, 3.0
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
        return run_all(args)
    except KeyboardInterrupt:
        print("interrupted: every process stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
