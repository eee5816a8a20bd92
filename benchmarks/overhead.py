"""What the Monitor costs a training loop: step time with and without it, measured in the same run.

    python benchmarks/overhead.py [--quick] [--rounds N] [--sizes 1ms,10ms,20ms] [--threads default,1]
                                  [--device cpu|cuda]

Three step sizes (~1 ms, ~10 ms and >= 20 ms) and four conditions (no viewer, a live viewer, a
frozen viewer, ``full``: everything a default Monitor does), each after an A/A (``plain again``: a
second plain model where the watched one would be, the spread two identical loops show on this
machine at that hour); a plain and a watched model train in alternating blocks of about a second,
and the ratio is the median of adjacent blocks' ratios of mean step times (``blocks.py``: why
means, and why a second; and why subnormals are flushed in every arm).

Targets (README, "What monitoring costs"): ratio <= 1.05 at ~1 ms steps, <= 1.02 at ~10 ms and
longer (TrainCheck, OSDI 2025, reports a median of 1.05x for its checks, worst 1.6x). Also printed:
the median cost of one ``mon.step()`` call in microseconds, the messages the publisher dropped
(queue full), and ``hooks``: per step, the time spent in the sampler's and the checker's hooks and assembly
(``full`` only; part of the ratio, not added to it). What a frozen viewer misses is not in that
count: ZeroMQ drops it for that viewer alone, silently; the viewer sees gaps in ``seq``.

How it measures (ABBA blocks, the conditions, ``--device cuda``): docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from blocks import (
    STEAL_LIMIT,
    Steal,
    add_steal_option,
    add_threads_option,
    arms,
    block_steps,
    calm,
    chosen,
    flush_subnormals,
    middle_half,
    pair_ratio,
    thread_counts,
)
from learnable import learnable_batches

from publisher.monitor import Monitor
from publisher.patches import torch_calls

#: torch's own, before the Monitor's watch wraps it (for the plain arm); the monitored arm calls
#: the wrapped one, installed here as a Monitor would.
TORCH_CROSS_ENTROPY = nn.functional.cross_entropy
torch_calls.install()
CPU = torch.device("cpu")
#: Distinct batches each arm cycles through, one pass of a small dataset (``full`` fingerprints
#: some of them on the way: the first of each pass, then runs of consecutive ones).
BATCHES = 128

#: A subscriber in its own process: connects, says "ready" once it received a message, then
#: reads and decodes everything until terminated, and prints how many messages it read.
VIEWER = """
import signal, sys, zmq
from publisher.wire.protocol import decode
context = zmq.Context()
sub = context.socket(zmq.SUB)
sub.subscribe(b"")
sub.connect(sys.argv[1])
count = 0
stop = False
def finish(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, finish)
sub.recv()
print("ready", flush=True)
while not stop:
    if sub.poll(50):
        decode(sub.recv())
        count += 1
print(count, flush=True)
"""


@dataclass(frozen=True)
class ModelSize:
    key: str  # what --sizes names it by
    name: str
    dims: tuple[int, int, int]  # input, hidden, classes
    batch: int
    target: float  # the worst ratio allowed at this size


#: ABBA rounds of two ~1 s blocks per size and condition (a third with ``--quick``). The sizes are
#: those of the cost targets (~1 ms and ~10 ms steps) and a larger one.
ROUNDS = 12
SIZES = (
    ModelSize("1ms", "~1 ms step", (128, 256, 10), batch=64, target=1.05),
    ModelSize("10ms", "~10 ms step", (512, 768, 512), batch=64, target=1.02),
    ModelSize("20ms", ">=20 ms step", (512, 1024, 512), batch=160, target=1.02),
)
#: On a GPU the CPU sizes are a few kernel launches: a small MLP whose step is launch-bound (the
#: Monitor's host work is then most exposed), and a ~200M-parameter one (fp32, 768 rows: ~0.9
#: TFLOP a step) for ~10-50 ms at an H100/H200's fp32 rate. Batches (``BATCHES`` of them, ~3 GB
#: an arm at the large size) and both models live on the device.
CUDA_SIZES = (
    ModelSize("small", "<1 ms (cuda)", (512, 1024, 512), batch=160, target=1.05),
    ModelSize("large", "~20 ms (cuda)", (8192, 8192, 8192), batch=768, target=1.02),
)
#: The run's own A/A: a second plain model in the watched arm's place, no Monitor. Its ratio is how
#: far from 1.000 two identical loops read on this machine at that hour, the noise the others' ratios
#: are read against.
A_A = "plain again"
CONDITIONS = (A_A, "no viewer", "live viewer", "frozen viewer", "full")
#: Steps before measuring: a long run's steady state is what matters, not its start. ``full``
#: measures every layer and checks every invariant on each of the first few steps (bugs present
#: from the start show at once), and its cost budgets settle over the first few hundred steps.
WARM_UP_STEPS = 300


class Trainer:
    """A real MLP training step (forward, backward, Adam) over a fixed set of distinct batches.

    ``cross_entropy`` is the function the step calls: the plain arm gets torch's own, captured
    before any Monitor wrapped it (:mod:`publisher.patches.torch_calls`), so that the wrapper's
    cost is on the monitored arm only.
    """

    def __init__(self, size: ModelSize, cross_entropy: Callable[..., torch.Tensor],
                 device: torch.device = CPU) -> None:
        torch.manual_seed(0)
        d_in, hidden, classes = size.dims
        layers = [nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()]
        self.model = nn.Sequential(*layers, nn.Linear(hidden, classes)).to(device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.batches = learnable_batches(BATCHES, size.batch, d_in, classes, device)
        self.batch = size.batch
        self.cross_entropy = cross_entropy
        self.data: Iterator[tuple[torch.Tensor, torch.Tensor]] = itertools.cycle(self.batches)

    def feed_through(self, mon: Monitor) -> None:
        """Take the batches through ``mon.track_data``, one pass after another (timed, fingerprinted)."""
        self.data = itertools.chain.from_iterable(mon.track_data(self.batches) for _ in itertools.count())

    def forward_backward_step(self) -> torch.Tensor:
        inputs, labels = next(self.data)
        self.optimizer.zero_grad()
        loss = self.cross_entropy(self.model(inputs), labels)
        loss.backward()
        self.optimizer.step()
        return loss


@contextmanager
def viewer(condition: str, endpoint: str) -> Iterator[subprocess.Popen[str] | None]:
    """The viewer process of a condition (None for "no viewer"), stopped and reaped at the end."""
    if condition in (A_A, "no viewer", "full"):
        yield None
        return
    process = subprocess.Popen(
        [sys.executable, "-c", VIEWER, endpoint], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    try:
        yield process
    finally:
        if condition == "frozen viewer":
            process.send_signal(signal.SIGCONT)
        process.terminate()
        try:
            process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


def wait_ready(process: subprocess.Popen[str], publish: Callable[[], None]) -> None:
    """Publish until the viewer says it receives (the slow-joiner handshake)."""
    assert process.stdout is not None
    os.set_blocking(process.stdout.fileno(), False)
    deadline = time.monotonic() + 30
    while True:
        publish()
        line = process.stdout.readline()
        if line.strip() == "ready":
            break
        if time.monotonic() > deadline:
            raise RuntimeError("the viewer process never received a message")
        time.sleep(0.05)
    os.set_blocking(process.stdout.fileno(), True)


def measure(size: ModelSize, condition: str, rounds: int, device: torch.device = CPU,
            steal_limit: float = STEAL_LIMIT) -> dict[str, float]:
    watched = condition != A_A
    plain = Trainer(size, TORCH_CROSS_ENTROPY, device)
    trainer = Trainer(size, nn.functional.cross_entropy if watched else TORCH_CROSS_ENTROPY, device)
    cuda = device.type == "cuda"
    full = condition == "full"
    with tempfile.TemporaryDirectory() as runtime:
        os.environ["TUIMON_RUNTIME_DIR"] = runtime
        mon = Monitor(trainer.model, trainer.optimizer, run=f"overhead-{condition}",
                      gpu="auto" if cuda else "simulated", stats=full, invariants=full) if watched else None
        if mon is not None and full:
            trainer.feed_through(mon)
        with viewer(condition, mon.endpoint if mon is not None else "") as process:
            if process is not None and mon is not None:
                wait_ready(process, lambda: mon.event("checkpoint", "benchmark handshake", severity="info"))
            if condition == "frozen viewer":
                assert process is not None and mon is not None
                process.send_signal(signal.SIGSTOP)
                for _ in range(30_000):  # fill its queue: from here on the publisher drops for it
                    mon.step(1.0)
                while mon.publisher.stats()["queued"]:
                    time.sleep(0.01)
            for _ in range(WARM_UP_STEPS):  # both arms
                plain.forward_backward_step()
                loss = trainer.forward_backward_step()
                if mon is not None:
                    mon.step(loss, samples=trainer.batch)
            steps_per_block = block_steps(
                lambda: (plain.forward_backward_step(), cuda and torch.cuda.synchronize(device)))
            own_before = _own_seconds(mon)
            without: list[float] = []
            with_monitor: list[float] = []
            call_costs: list[float] = []
            pair_ratios: list[float] = []  # per round: mean with / mean without, side by side
            round_steals: list[list[float | None]] = []  # per round: each block's steal
            process_cpu = {False: 0.0, True: 0.0}  # CPU seconds of the whole process (all threads) per arm
            for round_index in range(rounds):
                block_times: dict[bool, list[float]] = {False: [], True: []}
                steals: list[float | None] = []
                for monitored in arms(round_index):
                    steal = Steal()
                    cpu_started = time.process_time()
                    for _ in range(steps_per_block):
                        started = time.perf_counter()
                        loss = (trainer if monitored else plain).forward_backward_step()
                        if monitored and mon is not None:
                            before_call = time.perf_counter()
                            mon.step(loss, samples=trainer.batch)
                            call_costs.append(time.perf_counter() - before_call)
                        if cuda:  # the step's device work, in both arms (see the module's docstring)
                            torch.cuda.synchronize(device)
                        block_times[monitored].append(time.perf_counter() - started)
                    process_cpu[monitored] += time.process_time() - cpu_started
                    steals.append(steal.share())
                round_steals.append(steals)
                without += block_times[False]
                with_monitor += block_times[True]
                pair_ratios.append(pair_ratio(block_times[True], block_times[False]))
            own = (_own_seconds(mon) - own_before) / (rounds * steps_per_block)
            calm_ratios = calm(pair_ratios, round_steals, steal_limit)
            dropped = 0
            if mon is not None:
                dropped = mon.publisher.stats()["dropped"]
                mon.close()
    os.environ.pop("TUIMON_RUNTIME_DIR", None)
    return {
        "without_ms": statistics.fmean(without) * 1e3,
        "with_ms": statistics.fmean(with_monitor) * 1e3,
        "ratio": middle_half(calm_ratios)[1],
        "calm": len(calm_ratios),
        "rounds": rounds,
        "all_ratio": statistics.median(pair_ratios),
        "call_us": statistics.median(call_costs) * 1e6 if call_costs else math.nan,
        "cpu_ratio": process_cpu[True] / process_cpu[False],
        "dropped": dropped,
        "own_us": own * 1e6,
    }


def _own_seconds(mon: Monitor | None) -> float:
    """Time spent inside the per-layer sampler and the invariant checker so far (their own cost)."""
    if mon is None:
        return 0.0
    seconds = mon._layers.seconds_spent if mon._layers else 0.0
    if mon._invariants is not None:
        seconds += mon._invariants.checker.overhead()["seconds"]
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a third of the rounds (~4 min, not ~10)")
    add_threads_option(parser)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="where the models train (default cpu; cuda: the GPU sizes, see above)")
    parser.add_argument("--rounds", type=int, help=f"ABBA rounds a size and condition (default {ROUNDS}:"
                        " a median good to about two points on this machine; more for a finer figure)")
    parser.add_argument("--sizes", help="the sizes to run, by name: 1ms,10ms,20ms on the CPU,"
                        " small,large with --device cuda (default all)")
    add_steal_option(parser)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    flush_subnormals()
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda: no CUDA device (torch {torch.__version__})")
    sizes = CUDA_SIZES if device.type == "cuda" else SIZES
    counts = thread_counts(parser, args.threads)
    rounds = args.rounds or (max(2, ROUNDS // 3) if args.quick else ROUNDS)
    if args.sizes:
        wanted = chosen(parser, f"--sizes (on {args.device})", args.sizes, [size.key for size in sizes])
        sizes = tuple(size for size in sizes if size.key in wanted)
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}")
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs. Step times are means;"
        " ratio is the median over calm rounds (the host took at most"
        f" {args.steal_limit:g} of the CPU time in either block) of (with / without) in adjacent ~1 s blocks"
        " (robust to drift); all: the median over every round."
    )
    columns = {"without": 10, "with": 10, "ratio": 8, "calm": 7, "all": 8, "cpu": 8, "step()": 10,
               "dropped": 9, "hooks": 10}
    for threads in counts:
        torch.set_num_threads(threads)
        print(f"at {threads} torch thread(s)")
        measure_sizes(sizes, columns, rounds, device, args.steal_limit)
    return 0


def measure_sizes(sizes: tuple[ModelSize, ...], columns: dict[str, int], rounds: int, device: torch.device,
                  steal_limit: float) -> None:
    """Every condition at every size, at the current thread count: one row each, then the verdicts."""
    header = f"{'model':<14}{'condition':<15}" + "".join(f"{name:>{w}}" for name, w in columns.items())
    print(header)
    print("-" * len(header))
    started = time.monotonic()
    ratios: dict[str, list[float]] = {}  # per size, the watched conditions'
    same: dict[str, float] = {}  # per size, the A/A's ratio
    for size in sizes:
        for condition in CONDITIONS:
            r = measure(size, condition, rounds, device, steal_limit)
            if condition == A_A:
                same[size.name] = r["ratio"]
            else:
                ratios.setdefault(size.name, []).append(r["ratio"])
            calm_rounds = f"{r['calm']}/{r['rounds']}"
            print(
                f"{size.name:<14}{condition:<15}{r['without_ms']:>8.2f}ms{r['with_ms']:>8.2f}ms"
                f"{r['ratio']:>8.3f}{calm_rounds:>7}{r['all_ratio']:>8.3f}{r['cpu_ratio']:>8.3f}"
                f"{r['call_us']:>8.1f}us{r['dropped']:>9}"
                f"{r['own_us']:>8.1f}us",
                flush=True,
            )
    print(f"({time.monotonic() - started:.0f} s)")
    for size in sizes:
        worst = max(ratios[size.name])
        verdict = ("a condition had no calm round" if any(math.isnan(r) for r in ratios[size.name])
                   else "ok" if worst <= size.target else "ABOVE TARGET")
        print(f"worst ratio {size.name}: {worst:.3f} (target {size.target}) {verdict};"
              f" {A_A}: {same[size.name]:.3f}")


if __name__ == "__main__":
    sys.exit(main())
