"""What the same background Python work costs a training loop: in a thread, or in a process of its own.

    python benchmarks/gil_share.py [--rounds N] [--passes P]

``cost_split.py`` shows that most of what a Monitor adds to a ~1-2 ms CPU step is not its own code
on the training thread but the training thread waiting (``waits``) and computing slower (``cpu``)
while the step worker and the sender run (docs/benchmarks.md). This benchmark isolates that mechanism with
a stand-in for their work: tuimon's detector suite run on synthetic steps, ``P`` passes every
0.1 s (the step worker's hand-off period), pure Python as theirs is. The bare MLP loop of
``cost_split.py`` trains in blocks of about a second, each arm in turn (reversed every other
round), against:

- ``thread``: the work in a thread of the training process, holding the GIL through each burst
  (as a step worker does, handling the steps queued since its last turn);
- ``thread, yielding``: the same thread releasing the GIL after every pass (``time.sleep(0)``);
- ``process``: the same work in a process of its own, which shares no GIL with the training.

Per arm: the ratio of its mean step time to the bare blocks' (median over rounds, with the middle
half of the rounds' ratios), the training thread's extra CPU and off-CPU time per step (off CPU:
waiting for the GIL; a wait for a core would show in ``schedstat``, and does not here), the
background work's own CPU per step, and ``cost/cpu``: microseconds of training time each
microsecond of background CPU costs.

Why a thread costs more than its CPU: CPython hands the GIL between a thread that computes in
Python and one that keeps releasing it (every torch operation does) so that the releasing thread
waits for the whole of the other's turn, up to the switch interval (5 ms), each time it wants the
GIL back: the "convoy effect" (D. Beazley, "Understanding the Python GIL", PyCon 2010; Python bug
tracker bpo-7946, "Convoy effect with I/O bound threads and New GIL").
"""

from __future__ import annotations

import argparse
import array
import mmap
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import TypeAlias

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from blocks import add_block_option, block_steps, middle_half, pair_ratio  # noqa: E402
from cost_split import mlp  # noqa: E402
from overhead import TORCH_CROSS_ENTROPY, WARM_UP_STEPS  # noqa: E402

from publisher.detectors.base import TrainingContext  # noqa: E402
from publisher.detectors.suite import default_detectors  # noqa: E402

#: CPU seconds, added up in element 0: an array in this process, or a float mapped from a file.
Tally: TypeAlias = "array.array[float] | memoryview[float]"

#: The arms, in the order of even rounds.
ARMS = ("bare", "thread", "thread, yielding", "process")
PERIOD_S = 0.1


class Work:
    """The stand-in for the step worker's work: ``passes`` detector-suite passes a period, over
    synthetic steps of a slowly falling loss."""

    def __init__(self, passes: int) -> None:
        self.passes = passes
        self._detectors = default_detectors()
        context = TrainingContext()
        for detector in self._detectors:
            detector.rank = 0
            detector.context = context
        self._step = 0
        self._random = random.Random(0)

    def burst(self, yielding: bool) -> None:
        """One period's passes; ``yielding``: release the GIL after each."""
        for _ in range(self.passes):
            self._step += 1
            metrics = {"loss": 2.3 - self._step * 1e-6 + self._random.random() * 0.01, "lr": 0.01,
                       "step_time": 0.0015 + self._random.random() * 1e-4, "steps_per_s": 650.0,
                       "compute_time": 0.0012, "grad_norm": 1.0}
            for detector in self._detectors:
                detector.observe_step(self._step, metrics)
            if yielding:
                time.sleep(0)

    def every_period(self, mode: dict[str, str], spent: Tally) -> None:
        """Loop forever: a burst each period while ``mode["arm"]`` is a thread arm, adding its CPU
        seconds to ``spent[0]``: measured by the working thread itself, the same way in every arm
        (``/proc/PID/stat`` counts clock ticks of 10 ms, too coarse for the few milliseconds of
        a short block: the process arm read 0 once in CI)."""
        while True:
            started = time.perf_counter()
            arm = mode["arm"]
            if arm.startswith("thread"):
                cpu = time.thread_time()
                self.burst(yielding=arm == "thread, yielding")
                spent[0] += time.thread_time() - cpu
            time.sleep(max(0.0, PERIOD_S - (time.perf_counter() - started)))


def shared_tally(path: str) -> Tally:
    """One float in file ``path``, mapped into memory: the process arm's server adds its CPU
    seconds there and the training process reads them, even while the server is stopped."""
    with open(path, "r+b") as backing:
        return memoryview(mmap.mmap(backing.fileno(), 8)).cast("d")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=12, help="rounds of one block per arm (default 12)")
    parser.add_argument("--passes", type=int, default=60,
                        help="detector-suite passes per 0.1 s (default 60: ~45 us of CPU a MLP step here)")
    parser.add_argument("--serve", metavar="TALLY", help=argparse.SUPPRESS)  # the process arm's side
    add_block_option(parser)
    args = parser.parse_args(argv)
    work = Work(args.passes)
    if args.serve:  # stopped and resumed by signals; killed at the end
        print("ready", flush=True)
        work.every_period({"arm": "thread"}, shared_tally(args.serve))
    torch.set_num_threads(1)
    loop = mlp(TORCH_CROSS_ENTROPY)
    mode, thread_cpu = {"arm": "bare"}, array.array("d", [0.0])
    threading.Thread(target=work.every_period, args=(mode, thread_cpu), daemon=True).start()
    tally_file = tempfile.NamedTemporaryFile(prefix="gil_share-", suffix=".tally")  # noqa: SIM115
    tally_file.write(bytes(8))
    tally_file.flush()
    server_cpu = shared_tally(tally_file.name)
    server = subprocess.Popen([sys.executable, __file__, "--serve", tally_file.name, "--passes",
                               str(args.passes)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline() == "ready\n"  # its imports done
        os.kill(server.pid, signal.SIGSTOP)
        for _ in range(WARM_UP_STEPS):
            loop.step()
        steps_per_block = block_steps(loop.step, args.block_s)
        means: dict[str, list[float]] = {arm: [] for arm in ARMS}
        train_cpu = dict.fromkeys(ARMS, 0.0)
        wall = dict.fromkeys(ARMS, 0.0)
        background = dict.fromkeys(ARMS, 0.0)
        for index in range(args.rounds):
            for arm in ARMS if index % 2 == 0 else ARMS[::-1]:
                mode["arm"] = arm
                os.kill(server.pid, signal.SIGCONT if arm == "process" else signal.SIGSTOP)
                time.sleep(PERIOD_S)  # the previous arm's burst is over
                cpu, started = time.thread_time(), time.perf_counter()
                thread_before, server_before = thread_cpu[0], server_cpu[0]
                times = []
                for _ in range(steps_per_block):
                    step_started = time.perf_counter()
                    loop.step()
                    times.append(time.perf_counter() - step_started)
                wall[arm] += time.perf_counter() - started
                train_cpu[arm] += time.thread_time() - cpu
                background[arm] += thread_cpu[0] - thread_before
                background[arm] += server_cpu[0] - server_before
                means[arm].append(statistics.fmean(times))
        mode["arm"] = "bare"
    finally:
        server.kill()
        server.wait()
        tally_file.close()
    steps = args.rounds * steps_per_block
    off_cpu = {arm: wall[arm] - train_cpu[arm] for arm in ARMS}
    per_step = {arm: {"cpu": (train_cpu[arm] - train_cpu["bare"]) / steps * 1e6,
                      "off": (off_cpu[arm] - off_cpu["bare"]) / steps * 1e6,
                      "extra": (wall[arm] - wall["bare"]) / steps * 1e6,
                      "background": background[arm] / steps * 1e6} for arm in ARMS}
    print(f"torch {torch.__version__}, 1 thread, {os.cpu_count()} CPUs; {args.passes} detector-suite passes "
          f"every {PERIOD_S} s; bare step {statistics.fmean(means['bare']) * 1e3:.2f} ms; {args.rounds} "
          f"rounds of ~1 s blocks ({steps_per_block} steps)")
    header = (f"{'arm':<18}{'ratio':>8}{'rounds q1-q3':>15}{'train cpu':>11}{'off cpu':>10}{'bg cpu':>10}"
              f"{'cost/cpu':>10}")
    print(header)
    print("-" * len(header))
    for arm in ARMS[1:]:
        ratios = [pair_ratio([m], [b]) for m, b in zip(means[arm], means["bare"], strict=True)]
        q1, median, q3 = middle_half(ratios)
        row = per_step[arm]
        cost = row["extra"] / row["background"] if row["background"] > 0 else float("nan")
        print(f"{arm:<18}{median:>8.3f}{f'{q1:.3f}-{q3:.3f}':>15}{row['cpu']:>9.0f}us"
              f"{row['off']:>8.0f}us{row['background']:>8.0f}us{cost:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
