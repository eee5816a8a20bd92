"""Alternating blocks: how the cost benchmarks set a monitored loop against a plain one.

Two arms train in alternating blocks, ABBA (plain first in even rounds, monitored first in odd
ones), so that a shared machine's drift hits both alike, and the figure is the median over rounds
of the ratio of two adjacent blocks.

A block's figure is its *mean* step time, and a block lasts about :data:`BLOCK_S`, ten of the
Monitor's hand-off periods (``publisher.wire.transport.HANDOFF_S``): the step worker and the
sender do the steps' work in bursts, once a period, and a burst delays the few training steps it
overlaps (the training thread waits for the GIL, and the two threads share the machine's cores).
A median per block drops those few steps, and a block shorter than a period may hold no burst at
all; measured on the ~1 ms MLP of ``cost_split.py`` (issue 23), medians of 20-step blocks read
1.06x where means of 600-step blocks read 1.13x, and only the second is what a run's wall time
pays. A burst that falls after the end of a monitored block lands in the next block, monitored or
plain alike in ABBA order, so about one period in ten of the threads' work goes uncounted: the
ratio errs low by up to a tenth of the monitor's cost, not more.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable, Sequence

from publisher.wire.transport import HANDOFF_S

#: Seconds a block lasts: ten hand-off periods.
BLOCK_S = 10 * HANDOFF_S


def add_block_option(parser: argparse.ArgumentParser) -> None:
    """``--block-s``, the seconds a block lasts (a benchmark's runs are that much shorter)."""
    parser.add_argument("--block-s", type=float, default=BLOCK_S,
                        help=f"seconds a block lasts (default {BLOCK_S:g}: ten hand-off periods; shorter "
                             "blocks leave more of the background threads' work uncounted: for a quick "
                             "check that the script runs, not for figures)")


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
