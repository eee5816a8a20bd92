"""What ``Monitor.step`` costs the training thread, against the least a call there can cost.

    python benchmarks/step_floor.py [--steps 1000] [--rounds 5] [--models mlp,deep,gpt2]

The target is ``mon.step()`` at most 15 us (median) on the training thread, whatever the
model. Called back to back on one loss, with its code and data in the caches, a default Monitor's
``step()`` takes a few microseconds; called between training steps, whose kernels evict the
caches, several times that, and more the larger the model (``cost_split.py``'s ``step()``
column). This benchmark tells the two apart, per model of ``cost_split.py``, in one process with
a default Monitor (no viewer), each arm in turn for ``--steps`` training steps a round (the order
reversed every other round), medians over all its calls:

- ``step()``: ``Monitor.step(loss)`` after each training step (the issue's figure);
- ``+ extras``: the same with two numbers of the loop's own, ``Monitor.step(loss, correct=...,
  seen=...)`` (a count kept in a tensor on the CPU, an int), as loops that report an accuracy do;
- ``append``: the least any ``step()`` can do, appending (time, loss) to a list, after each
  training step: the floor set by the caches and the call;
- ``+ item``: the same with the loss read on the training thread (``loss.item()``);
- ``warm``: ``Monitor.step`` called back to back on one loss, no training between the calls.

Printed: the four medians (us), then ``step()/append`` (how far above the floor the Monitor's
work is) and ``step()/warm`` (how much more the same work costs with its caches evicted).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from blocks import add_threads_option, chosen, thread_counts  # noqa: E402
from cost_split import MODELS, Loop  # noqa: E402
from overhead import WARM_UP_STEPS  # noqa: E402

from publisher.monitor import Monitor  # noqa: E402

ARMS = ("step()", "+ extras", "append", "+ item", "warm")


def measure(loop: Loop, mon: Monitor, steps: int, rounds: int) -> dict[str, float]:
    """Median call time (s) of each arm over ``rounds`` rounds of ``steps`` calls."""
    kept: list[tuple[float, torch.Tensor | float]] = []
    one_loss = loop.step()

    def append(loss: torch.Tensor) -> None:
        kept.append((time.perf_counter(), loss))

    def append_item(loss: torch.Tensor) -> None:
        kept.append((time.perf_counter(), loss.item()))

    correct = torch.zeros(())

    def step_extras(loss: torch.Tensor) -> None:
        mon.step(loss, correct=correct, seen=64)

    calls: dict[str, Callable[[torch.Tensor], None]] = {
        "step()": mon.step, "+ extras": step_extras, "append": append, "+ item": append_item}
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for round_index in range(rounds):
        for arm in ARMS if round_index % 2 == 0 else reversed(ARMS):
            taken = times[arm]
            if arm == "warm":
                for _ in range(steps):
                    started = time.perf_counter()
                    mon.step(one_loss)
                    taken.append(time.perf_counter() - started)
                continue
            call = calls[arm]
            for _ in range(steps):
                loss = loop.step()
                started = time.perf_counter()
                call(loss)
                taken.append(time.perf_counter() - started)
            kept.clear()
    return {arm: statistics.median(taken) for arm, taken in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000, help="calls of each arm a round (default 1000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(MODELS)}")
    add_threads_option(parser)
    args = parser.parse_args(argv)
    models = chosen(parser, "--models", args.models, list(MODELS))
    for threads, name in itertools.product(thread_counts(parser, args.threads), models):
        torch.set_num_threads(threads)
        if name == models[0]:
            print(f"torch {torch.__version__}, {threads} thread(s); medians of {args.rounds} x {args.steps} "
                  "calls an arm, in us")
            print(f"{'model':<8}{'step()':>9}{'+ extras':>10}{'append':>9}{'+ item':>9}{'warm':>9}"
                  f"{'step()/append':>15}{'step()/warm':>13}")
        loop = MODELS[name](torch.nn.functional.cross_entropy)
        with tempfile.TemporaryDirectory() as runtime:
            os.environ["TUIMON_RUNTIME_DIR"] = runtime
            mon = Monitor(loop.model, loop.optimizer, run=f"step-floor-{name}", gpu="simulated")
            try:
                for _ in range(WARM_UP_STEPS):
                    mon.step(loop.step())
                medians = measure(loop, mon, args.steps, args.rounds)
                us = {arm: seconds * 1e6 for arm, seconds in medians.items()}
            finally:
                mon.close()
            os.environ.pop("TUIMON_RUNTIME_DIR", None)
        print(f"{name:<8}{us['step()']:>9.1f}{us['+ extras']:>10.1f}{us['append']:>9.1f}{us['+ item']:>9.1f}"
              f"{us['warm']:>9.1f}{us['step()'] / us['append']:>15.1f}{us['step()'] / us['warm']:>13.1f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
