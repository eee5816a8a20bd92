"""What each of the Monitor's features costs a training step, by leaving it out, in one run.

    python benchmarks/feature_cost.py [--rounds N] [--model mlp|deep|gpt2]

``cost_split.py`` splits a default Monitor's cost by where in the step it falls; this splits it by
what pays for it. Several copies of one model (``cost_split.py``'s models, each made after the same
seed, so they train alike) train in turn, one bare and each of the others under a Monitor of its
own: the defaults (``all``); the defaults less one feature (``-invariants``, ``-stats``: per-layer
samples, ``-detectors``, ``-grad norm``: its budget at one millionth, so it is measured on the
first steps only); and none of those four (``base``: what any Monitor costs, the step's
capture, the step worker and the publisher's process, the non-finite check's and the compute
clock's hooks, the hang watchdog). A feature's cost is ``all``'s extra time per step less the
arm without it. ``bare again``, a second bare copy, is the run's own A/A: how far from 1.000 a
ratio reads where nothing differs, the smallest cost this run can tell.

The arms take turns in blocks of about a second (``blocks.py``), in forward then reverse order
from round to round, so that a shared machine's drift hits them alike; each arm's figure is the
median over rounds of its block's mean step time over the bare block's of that round. Every
Monitor lives through the whole run, so each arm's background threads wake (and cost a little)
during the others' blocks too: the figures are each feature's share of the machine's attention,
not a Monitor alone's, and sum to a little more than ``all``'s. No viewer is subscribed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from blocks import (
    Steal,
    add_block_option,
    add_steal_option,
    add_threads_option,
    block_steps,
    calm,
    flush_subnormals,
    middle_half,
    thread_counts,
)
from cost_split import MODELS, Loop
from overhead import TORCH_CROSS_ENTROPY, WARM_UP_STEPS

from publisher.monitor import Monitor

#: ABBA rounds (each arm's block once a round).
ROUNDS = 16
#: The Monitor's settings for each arm (None: the bare loop).
WITHOUT: dict[str, dict[str, Any] | None] = {
    "bare": None,
    "bare again": None,
    "all": {},
    "-invariants": {"invariants": False},
    "-stats": {"stats": False},
    "-detectors": {"detectors": False},
    "-grad norm": {"grad_norm_budget": 1e-6},
    "base": {"invariants": False, "stats": False, "detectors": False, "grad_norm_budget": 1e-6},
}


def run_block(loop: Loop, mon: Monitor | None, steps: int) -> tuple[float, float | None]:
    """Mean seconds a step over ``steps`` steps of ``loop`` (watched by ``mon`` where given), and
    the share of the machine's CPU time the host took meanwhile (``blocks.Steal``)."""
    steal = Steal()
    started = time.perf_counter()
    if mon is None:
        for _ in range(steps):
            loop.step().item()  # the bare loop reads its loss too, as a loop that logs it does
    else:
        for _ in range(steps):
            mon.step(loop.step())
    return (time.perf_counter() - started) / steps, steal.share()


def measure(model: str, rounds: int, block_s: float
            ) -> tuple[dict[str, list[float]], dict[str, list[list[float | None]]]]:
    """Per arm, its rounds' ratios of mean step time to the bare arm's, and each ratio's two blocks'
    steal (the arm's and the bare one's)."""
    # The bare arm calls torch's own loss, the others the one a Monitor wraps (as in cost_split.py).
    loops = {arm: MODELS[model](TORCH_CROSS_ENTROPY if settings is None else nn.functional.cross_entropy)
             for arm, settings in WITHOUT.items()}
    mons: dict[str, Monitor | None] = {}
    with tempfile.TemporaryDirectory() as runtime:
        os.environ["TUIMON_RUNTIME_DIR"] = runtime
        try:
            for arm, settings in WITHOUT.items():
                mons[arm] = None if settings is None else Monitor(
                    loops[arm].model, loops[arm].optimizer, run=f"feature-cost-{len(mons)}", gpu="simulated",
                    **settings)
            for arm in WITHOUT:
                run_block(loops[arm], mons[arm], WARM_UP_STEPS)
            steps = block_steps(loops["bare"].step, block_s)
            ratios: dict[str, list[float]] = {arm: [] for arm in WITHOUT}
            steals: dict[str, list[list[float | None]]] = {arm: [] for arm in WITHOUT}
            order = list(WITHOUT)
            for index in range(rounds):
                blocks = {arm: run_block(loops[arm], mons[arm], steps)
                          for arm in (order if index % 2 == 0 else order[::-1])}
                bare_mean, bare_steal = blocks["bare"]
                for arm, (mean, steal) in blocks.items():
                    ratios[arm].append(mean / bare_mean)
                    steals[arm].append([steal, bare_steal])
        finally:
            for mon in mons.values():
                if mon is not None:
                    mon.close()
    os.environ.pop("TUIMON_RUNTIME_DIR", None)
    return ratios, steals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds (default {ROUNDS})")
    parser.add_argument("--model", default="mlp", choices=list(MODELS), help="the model (default mlp)")
    add_block_option(parser)
    add_steal_option(parser)
    add_threads_option(parser)
    args = parser.parse_args(argv)
    flush_subnormals()
    for threads in thread_counts(parser, args.threads):
        torch.set_num_threads(threads)
        measure_at_threads(args, threads)
    return 0


def measure_at_threads(args: argparse.Namespace, threads: int) -> None:
    """Every arm's row at ``threads`` torch threads."""
    ratios, steals = measure(args.model, args.rounds, args.block_s)
    kept = {arm: calm(ratios[arm], steals[arm], args.steal_limit) for arm in ratios}
    print(f"torch {torch.__version__}, {threads} thread(s), {os.cpu_count()} CPUs, model {args.model}, "
          f"{args.rounds} rounds; ratio: the median over calm rounds (the host took at most "
          f"{args.steal_limit:g} of the CPU time in both blocks) of the arm's mean step time over the bare "
          "arm's, q1-q3 its middle half; cost: all's ratio less the arm's, in points of the bare step; "
          "all rounds: the median over every round")
    print(f"{'arm':<14}{'ratio':>8}{'q1-q3':>15}{'cost':>8}{'calm':>8}{'all rounds':>12}")
    full = middle_half(kept["all"])[1]
    for arm, values in kept.items():
        if arm == "bare":
            continue
        every = f"{statistics.median(ratios[arm]):>12.3f}"
        share = f"{len(values)}/{len(ratios[arm])}"
        q1, middle, q3 = middle_half(values)
        cost = "" if arm in ("all", "bare again") else f"{(full - middle) * 100:+.1f}"
        print(f"{arm:<14}{middle:>8.3f}{f'{q1:.3f}-{q3:.3f}':>15}{cost:>8}{share:>8}{every}")


if __name__ == "__main__":
    sys.exit(main())
