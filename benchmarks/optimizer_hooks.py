"""What the Monitor's optimizer step hooks cost the training thread, in place, in one run.

    python benchmarks/optimizer_hooks.py [--rounds N] [--models mlp,deep,gpt2]

A default Monitor hooks ``optimizer.step()`` (``publisher/measure/step_hooks.py``: the non-finite
check, the invariants and the update probe as parts of one pre-hook and one post-hook). Between
training steps whose kernels have evicted the caches, each Python call there costs microseconds,
more than ratios against a bare loop can resolve on a shared machine (``cost_split.py``'s
``optimizer`` column moves by 10 µs between runs of one version). So one monitored loop trains
in alternating blocks with the hooks the Monitor registered attached and taken off the optimizer
(ABBA, :mod:`blocks`), and the figure is the training thread's own CPU time inside
``optimizer.step()`` per step (``time.thread_time_ns``, which waits for the GIL do not inflate),
the median over rounds of each arm's block, and their difference: what the hooks cost, their
parts' work on the steps due included (the gradient norm measured before the update, the
invariants' checks, the update probe). With the hooks off, that work is not done (the Monitor's
``step()`` then measures the gradient norm itself), so the difference is the hooks' whole cost to
the step, not what a run would save without them. ``step()`` is the median of the monitored
calls in each arm.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from blocks import add_block_option, add_threads_option, arms, block_steps, chosen, thread_counts
from cost_split import MODELS, Loop
from overhead import WARM_UP_STEPS

from publisher.monitor import Monitor

#: ABBA rounds per model (each arm's block once a round).
ROUNDS = 12
#: The training thread's part of a step that holds ``optimizer.step()``.
OPTIMIZER_PHASE = 2


@contextmanager
def hooks_taken_off(optimizer: torch.optim.Optimizer, added: dict[str, dict[int, object]]) -> Iterator[None]:
    """The hooks the Monitor added to ``optimizer`` taken off for the block (put back after it)."""
    tables = {"pre": optimizer._optimizer_step_pre_hooks, "post": optimizer._optimizer_step_post_hooks}
    for kind, hooks in added.items():
        for key in hooks:
            del tables[kind][key]
    try:
        yield
    finally:
        for kind, hooks in added.items():
            tables[kind].update(hooks)


def measure(loop: Loop, rounds: int, block_s: float) -> dict[str, float]:
    """Per arm (``on``: the hooks attached, ``off``), the median over rounds of the training
    thread's CPU µs a step in ``optimizer.step()`` and of ``step()``, and the hooks' count."""
    optimizer = loop.optimizer
    tables = {"pre": optimizer._optimizer_step_pre_hooks, "post": optimizer._optimizer_step_post_hooks}
    before = {kind: set(table) for kind, table in tables.items()}
    with tempfile.TemporaryDirectory() as runtime:
        os.environ["TUIMON_RUNTIME_DIR"] = runtime
        mon = Monitor(loop.model, optimizer, run="optimizer-hooks", gpu="simulated")
        added = {kind: {key: hook for key, hook in table.items() if key not in before[kind]}
                 for kind, table in tables.items()}
        for _ in range(WARM_UP_STEPS):
            mon.step(loop.step())
        steps = block_steps(lambda: mon.step(loop.step()), block_s)
        opt_us: dict[bool, list[float]] = {True: [], False: []}
        call_us: dict[bool, list[float]] = {True: [], False: []}
        for index in range(rounds):
            for attached in arms(index):
                spent = loop.phase_ns[OPTIMIZER_PHASE]
                calls = []
                with hooks_taken_off(optimizer, {} if attached else added):
                    for _ in range(steps):
                        loss = loop.step()
                        called = time.perf_counter()
                        mon.step(loss)
                        calls.append(time.perf_counter() - called)
                opt_us[attached].append((loop.phase_ns[OPTIMIZER_PHASE] - spent) / steps / 1e3)
                call_us[attached].append(statistics.median(calls) * 1e6)
        mon.close()
    os.environ.pop("TUIMON_RUNTIME_DIR", None)
    row = {"hooks": float(sum(len(hooks) for hooks in added.values()))}
    for arm, attached in (("on", True), ("off", False)):
        row[f"{arm}_opt_us"] = statistics.median(opt_us[attached])
        row[f"{arm}_call_us"] = statistics.median(call_us[attached])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"ABBA rounds a model (default {ROUNDS})")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    add_block_option(parser)
    add_threads_option(parser)
    args = parser.parse_args()
    models = chosen(parser, "--models", args.models, list(MODELS))
    for threads, name in itertools.product(thread_counts(parser, args.threads), models):
        torch.set_num_threads(threads)
        if name == models[0]:
            print(f"torch {torch.__version__}, {threads} thread(s); the training thread's CPU time in "
                  f"optimizer.step() per step, with the Monitor's step hooks on and off (median over "
                  f"{args.rounds} rounds of blocks)")
            print(f"{'model':<18}{'hooks':>6}{'opt, on':>11}{'opt, off':>11}{'hooks cost':>12}"
                  f"{'step() on':>11}{'step() off':>12}")
        loop = MODELS[name](torch.nn.functional.cross_entropy)
        row = measure(loop, args.rounds, args.block_s)
        cost = row["on_opt_us"] - row["off_opt_us"]
        print(f"{loop.name:<18}{row['hooks']:>6.0f}{row['on_opt_us']:>9.1f}us{row['off_opt_us']:>9.1f}us"
              f"{cost:>10.1f}us{row['on_call_us']:>9.1f}us{row['off_call_us']:>10.1f}us")


if __name__ == "__main__":
    main()
