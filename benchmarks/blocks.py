"""Alternating blocks: how the cost benchmarks set a monitored loop against a plain one.

Two arms train in alternating blocks, ABBA (plain first in even rounds, monitored first in odd
ones), so that a shared machine's drift hits both alike, and the figure is the median over rounds
of the ratio of two adjacent blocks.

A block's figure is its *mean* step time, and a block lasts about :data:`BLOCK_S`, ten of the
Monitor's hand-off periods (``publisher.wire.transport.HANDOFF_S``): the step worker and the
sender do the steps' work in bursts, once a period, and a burst delays the few training steps it
overlaps (the training thread waits for the GIL, and the two threads share the machine's cores).
A median per block drops those few steps, and a block shorter than a period may hold no burst at
all; measured on the ~1 ms MLP of ``cost_split.py``, medians of 20-step blocks read
1.06x where means of 600-step blocks read 1.13x, and only the second is what a run's wall time
pays. A burst that falls after the end of a monitored block lands in the next block, monitored or
plain alike in ABBA order, so about one period in ten of the threads' work goes uncounted: the
ratio errs low by up to a tenth of the monitor's cost, not more.

On a virtual machine, the host also takes the machine's CPUs for other guests now and then: that
time is *steal* in ``/proc/stat`` (proc(5)), and while it lasts the training thread stands still.
On this project's 2-core machine it came in bursts of 5-30 % of the CPU time over a block, and an
A/A run (two identical plain loops in alternating 1 s blocks, 40 rounds) read a middle half of
0.991-1.192 over every round but 0.992-1.034 over the 22 rounds whose blocks lost under 5 % to the
host. So each block's steal is read (:class:`Steal`), and a ratio is taken over the *calm* rounds,
those whose blocks lost at most ``--steal-limit`` (:func:`calm`); the other rounds are counted and
printed, not hidden. Where the kernel keeps no steal (not Linux, bare metal), every round is calm.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from publisher.wire.transport import HANDOFF_S

#: Seconds a block lasts: ten hand-off periods.
BLOCK_S = 10 * HANDOFF_S
#: The share of the machine's CPU time the host may take during a round's blocks for the round to
#: count as calm: an A/A run's spread came down to that of steal-free rounds below 5 %.
STEAL_LIMIT = 0.02
#: The kernel's CPU time counters: the first line sums every CPU's.
PROC_STAT = Path("/proc/stat")


def flush_subnormals() -> None:
    """Flush subnormal floats to zero in every arm (``torch.set_flush_denormal``: x86's FTZ/DAZ,
    ARM's FZ), before any model is built, so that a step's cost depends on the work it does and not
    on how far its model has trained.

    Adam's first moment of a weight whose gradient stays zero (a dead ReLU's) decays by 0.9 a step
    into the subnormals and, rounded to nearest, stays there; x86 does arithmetic on subnormals in
    microcode. On overhead.py's ~10 ms MLP, 0.6M of them appeared after ~800 steps and the step went
    from 11 to 24 ms (the >= 20 ms one: 1.1M, 30 to 55 ms). The onset is a matter of steps trained,
    so the arm that had trained more (the plain one: it times the block length first) ran slower,
    and two identical plain models read 0.89-0.95 in an A/A. Flushed, the step stays at 9-12 ms.
    GPUs handle subnormals at full speed, so this is also nearer what a GPU run costs. The setting
    is a thread's own: call this before the first parallel torch operation, so that torch's pool
    threads, made then, start with it (checked at two threads: both halves of a product flushed)."""
    torch.set_flush_denormal(True)


def chosen(parser: argparse.ArgumentParser, option: str, given: str, known: Sequence[str]) -> list[str]:
    """The names a comma-separated ``option`` gave (spaces allowed), each one of ``known``; an
    argparse error naming the others and the choices, not a KeyError halfway through a run."""
    names = [name.strip() for name in given.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(f"{option}: no {', '.join(unknown)}; choose from {', '.join(known)}")
    return names


#: torch's own intra-op thread count in this process, taken before any script sets one: the
#: machine's cores unless ``OMP_NUM_THREADS`` says otherwise, what a user's training runs at.
DEFAULT_THREADS = torch.get_num_threads()


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    """``--threads``, the torch thread counts a benchmark measures at, in turn."""
    parser.add_argument("--threads", default="default,1",
                        help=f"torch intra-op thread counts to measure at, in turn, comma-separated: a "
                             f"number, or 'default' for torch's own ({DEFAULT_THREADS} here: what a user's "
                             "training runs at; a thread of the Monitor's that ran torch's pool in parallel "
                             "cost nothing at 1) (default: default,1)")


def thread_counts(parser: argparse.ArgumentParser, given: str) -> list[int]:
    """The counts ``--threads`` names, each once, in its order; an argparse error for a bad one."""
    counts: list[int] = []
    for name in (name.strip() for name in given.split(",") if name.strip()):
        if name != "default" and not (name.isdigit() and int(name) > 0):
            parser.error(f"--threads: {name!r} is neither a positive number nor 'default'")
        count = DEFAULT_THREADS if name == "default" else int(name)
        if count not in counts:
            counts.append(count)
    return counts


def add_block_option(parser: argparse.ArgumentParser) -> None:
    """``--block-s``, the seconds a block lasts (a benchmark's runs are that much shorter)."""
    parser.add_argument("--block-s", type=float, default=BLOCK_S,
                        help=f"seconds a block lasts (default {BLOCK_S:g}: ten hand-off periods; shorter "
                             "blocks leave more of the background threads' work uncounted: for a quick "
                             "check that the script runs, not for figures)")


def add_steal_option(parser: argparse.ArgumentParser) -> None:
    """``--steal-limit``, the host's share of the machine's CPU time above which a round is not
    calm (:func:`calm`), for the benchmarks that take their ratios over calm rounds."""
    parser.add_argument("--steal-limit", type=float, default=STEAL_LIMIT,
                        help=f"a round whose blocks lost more than this share of the machine's CPU time to "
                             f"the virtual machine's host (steal, /proc/stat) is left out of the ratios "
                             f"(default {STEAL_LIMIT:g}; 1 keeps every round)")


class Steal:
    """The share of the machine's CPU time the host took for other guests since this was made:
    ``steal`` over all the time counters of /proc/stat's first line (proc(5)), None where the
    kernel keeps no such counter. Reading it costs a file read: once a block, not once a step."""

    def __init__(self, path: Path = PROC_STAT) -> None:
        self._path = path
        self._start = self._ticks()

    def share(self) -> float | None:
        end = self._ticks()
        if end is None or self._start is None:
            return None
        total = end[1] - self._start[1]
        return (end[0] - self._start[0]) / total if total > 0 else 0.0

    def _ticks(self) -> tuple[int, int] | None:
        """(steal, every counter summed) in clock ticks since boot."""
        try:
            with self._path.open() as stat:
                fields = stat.readline().split()
        except OSError:
            return None
        # cpu user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is also
        # counted in user and nice, so the sum stops at steal.
        if len(fields) < 9 or fields[0] != "cpu":
            return None
        counters = [int(value) for value in fields[1:9]]
        return counters[7], sum(counters)


def calm(ratios: Sequence[float], steals: Sequence[Sequence[float | None]], limit: float) -> list[float]:
    """The ratios of the rounds each of whose blocks lost at most ``limit`` of the CPU time to the
    host; ``steals`` holds each round's blocks' :meth:`Steal.share` (None, unknown, counts as calm)."""
    return [ratio for ratio, shares in zip(ratios, steals, strict=True)
            if all(share is None or share <= limit for share in shares)]


def middle_half(ratios: Sequence[float]) -> tuple[float, float, float]:
    """(q1, median, q3) of ``ratios``: NaN thrice for none, the one value thrice for one."""
    if not ratios:
        return math.nan, math.nan, math.nan
    if len(ratios) == 1:
        return ratios[0], ratios[0], ratios[0]
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    return q1, median, q3


def block_steps(step: Callable[[], object], seconds: float = BLOCK_S, probe: int = 20, least: int = 5) -> int:
    """Steps in a block of about ``seconds``, from the mean time of ``probe`` calls of ``step``
    (one training step of the plain arm; they warm it up too)."""
    started = time.perf_counter()
    for _ in range(probe):
        step()
    return max(least, math.ceil(seconds * probe / (time.perf_counter() - started)))


def arms(round_index: int) -> tuple[bool, bool]:
    """The order of the arms in a round (False: plain, True: monitored), ABBA."""
    return (False, True) if round_index % 2 == 0 else (True, False)


def pair_ratio(monitored: Sequence[float], plain: Sequence[float]) -> float:
    """One round's ratio: the monitored block's mean step time over the plain block's."""
    return statistics.fmean(monitored) / statistics.fmean(plain)
