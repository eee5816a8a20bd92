"""What a flood on a publisher's snapshot socket costs the training it watches.

    python benchmarks/flood.py [--rounds 8] [--block 1.0] [--connections 32]

Anyone on the node can connect to a publisher's snapshot socket. A real monitored training loop
(a small MLP, ~1-2 ms steps, one torch thread, a default Monitor) runs in this process while
attacker processes flood sockets with ``--connections`` DEALERs each, as fast as they can:

- ``junk``: random bytes, JSON that is not a request, frames over the size limit;
- ``requests``: valid snapshot requests, never reading the replies.

Each flood is aimed at two targets: the publisher's snapshot socket, and a decoy (another process
with a socket like it, which never reads). The decoy is the control: a flood costs this machine
its attacker's core, the kernel's network work and ZeroMQ's queues whoever is attacked; what the
publisher adds on top is the cost to training of its own handling. The attackers run in turn
(SIGSTOP/SIGCONT), in ``--rounds`` rounds of ``--block``-second blocks: the flood at the decoy, at
the publisher, the block right after it stopped, a rest, a quiet block. ``x decoy`` is the median
over rounds of (publisher block / decoy block), ``after x quiet`` of (block after / quiet block):
comparing neighbouring blocks, a shared machine's slow drift cancels out.

Also printed: the CPU used by the publisher's sender thread during the floods, the snapshot
socket's counters (frames refused as junk, requests refused by the rate limits, replies sent),
and, during the request flood, how long a well-behaved late joiner waited for its snapshot.

Targets: <= 1.10x during a flood, <= 1.02x within 5 s after it.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import psutil
import torch
import zmq
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from publisher import Monitor
from publisher.wire.protocol import SNAPSHOT_REQUEST

ATTACKER = r"""
import os, sys, zmq
address, kind, connections = sys.argv[1], sys.argv[2], int(sys.argv[3])
context = zmq.Context()
sockets = []
for _ in range(connections):
    s = context.socket(zmq.DEALER)
    s.sndhwm, s.linger = 1000, 0
    s.connect(address)
    sockets.append(s)
request = b'{"v": 1, "type": "snapshot_request"}'
junk = [os.urandom(40), b'{"v": 1, "type": "metrics"}', b"[" * 200, os.urandom(5000)]
i = 0
while True:
    try:
        sockets[i % connections].send(request if kind == "requests" else junk[i % len(junk)], zmq.NOBLOCK)
    except zmq.Again:
        pass
    i += 1
"""
DECOY = r"""
import time, zmq
router = zmq.Context().socket(zmq.ROUTER)
router.maxmsgsize, router.rcvhwm, router.linger = 256, 16, 0
router.bind("tcp://127.0.0.1:*")
print(router.last_endpoint.decode(), flush=True)
time.sleep(3600)
"""
COUNTERS = ("bad_requests", "snapshots_refused", "snapshots")


class Training:
    """The monitored loop, and the publisher sender thread's CPU time."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        torch.set_num_threads(1)
        self.model = nn.Sequential(
            nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.x, self.y = torch.randn(64, 256), torch.randint(0, 10, (64,))
        self.mon = Monitor(self.model, self.optimizer, run="flood", gpu="none")
        thread = next(t for t in threading.enumerate() if t.name == f"tuimon-publisher-{self.mon.rank}")
        self._sender_id = thread.native_id

    def steps(self, seconds: float) -> list[float]:
        times = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            started = time.perf_counter()
            loss = nn.functional.cross_entropy(self.model(self.x), self.y)
            loss.backward()
            self.optimizer.step()
            self.mon.step(loss, samples=64)
            self.optimizer.zero_grad()
            times.append(time.perf_counter() - started)
        return times

    def sender_cpu(self) -> float:
        thread = next((t for t in psutil.Process().threads() if t.id == self._sender_id), None)
        return thread.user_time + thread.system_time if thread else 0.0


def late_joiner(address: str, timeout_s: float = 20.0) -> float | None:
    """Seconds a well-behaved viewer waits for its snapshot (None: none within the timeout)."""
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.linger = 0
    dealer.connect(address)
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < timeout_s:
            dealer.send(SNAPSHOT_REQUEST)  # again after each timeout, as a viewer reconnecting would
            if dealer.poll(2000):
                dealer.recv_multipart()
                return time.perf_counter() - started
        return None
    finally:
        dealer.close(linger=0)


def attacker(target: str, kind: str, connections: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-c", ATTACKER, target, kind, str(connections)])
    time.sleep(0.3)
    process.send_signal(signal.SIGSTOP)
    return process


def rounds_of(training: Training, on_decoy: subprocess.Popen[bytes], on_publisher: subprocess.Popen[bytes],
              rounds: int, block: float, during: Callable[[], None] | None = None) -> dict[str, float]:
    """Rounds of: the flood at the decoy (a block), at the publisher (a block), the block right
    after it stopped, a rest, a quiet block. Returns the median over rounds of (publisher / decoy)
    and of (after / quiet), the publisher blocks' median step and the sender thread's CPU share."""
    during_ratios, after_ratios, publisher_steps = [], [], []
    cpu_spent = wall = 0.0
    for _ in range(rounds):
        medians = {}
        for name, process in (("decoy", on_decoy), ("publisher", on_publisher)):
            process.send_signal(signal.SIGCONT)
            time.sleep(0.2)  # the flood is under way again
            cpu, started = training.sender_cpu(), time.perf_counter()
            steps = training.steps(block)
            process.send_signal(signal.SIGSTOP)
            medians[name] = statistics.median(steps)
            if name == "publisher":
                cpu_spent += training.sender_cpu() - cpu
                wall += time.perf_counter() - started
                publisher_steps += steps
        medians["after"] = statistics.median(training.steps(block))
        training.steps(2 * block)
        medians["quiet"] = statistics.median(training.steps(block))
        during_ratios.append(medians["publisher"] / medians["decoy"])
        after_ratios.append(medians["after"] / medians["quiet"])
        if during is not None:
            during()
            during = None
    for process in (on_decoy, on_publisher):
        process.kill()
        process.wait()
    return {
        "during": statistics.median(during_ratios),
        "after": statistics.median(after_ratios),
        "median": statistics.median(publisher_steps),
        "cpu": cpu_spent / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="rounds per flood (default 8)")
    parser.add_argument("--block", type=float, default=1.0, help="seconds per block (default 1)")
    parser.add_argument("--connections", type=int, default=32, help="connections per attacker (default 32)")
    args = parser.parse_args()
    training = Training()
    address = training.mon.publisher.snapshot_endpoint
    decoy = subprocess.Popen([sys.executable, "-c", DECOY], stdout=subprocess.PIPE, text=True)
    decoy_address = decoy.stdout.readline().strip() if decoy.stdout else ""
    training.steps(3.0)  # warm-up: the Monitor's dense first steps, the budgets settling
    quiet = statistics.median(training.steps(3.0))
    rows = []
    joined: list[float | None] = []
    for kind in ("junk", "requests"):
        before = training.mon.publisher.stats()
        pair = attacker(decoy_address, kind, args.connections), attacker(address, kind, args.connections)
        joiner = None
        if kind == "requests":
            joiner = threading.Thread(target=lambda: joined.append(late_joiner(address)), daemon=True)
        result = rounds_of(training, *pair, args.rounds, args.block, during=joiner.start if joiner else None)
        if joiner is not None:
            joiner.join()
        stats = training.mon.publisher.stats()
        rows.append((kind, result, {k: stats[k] - before[k] for k in COUNTERS}))
    training.mon.close()
    decoy.kill()

    print(f"torch {torch.__version__}, 1 thread, {os.cpu_count()} CPUs, {args.connections} connections "
          f"per attacker, {args.rounds} rounds of {args.block:g} s blocks; quiet step {quiet * 1e3:.3f} ms")
    print(f"{'flood':<10}{'median step':>12}{'x decoy':>9}{'after x quiet':>15}{'sender CPU':>12}"
          f"{'junk':>9}{'refused':>9}{'served':>8}")
    print("-" * 84)
    for kind, result, counts in rows:
        print(f"{kind:<10}{result['median'] * 1e3:>10.3f}ms{result['during']:>9.3f}{result['after']:>15.3f}"
              f"{result['cpu']:>11.1%}{counts['bad_requests']:>9,}{counts['snapshots_refused']:>9,}"
              f"{counts['snapshots']:>8,}")
    wait = joined[0] if joined else None
    print("late joiner during the request flood: "
          + ("no snapshot within 20 s" if wait is None else f"snapshot after {wait:.2f} s"))
    print("targets: x decoy <= 1.10 during a flood, after x quiet <= 1.02 (5 s after it)")


if __name__ == "__main__":
    main()
