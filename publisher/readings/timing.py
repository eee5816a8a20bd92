"""When steps happen: the time between them, the typical step, and the time spent waiting for data.

The step time is measured between two ``Monitor.step()`` calls (one optimizer step to the next),
so it includes everything the loop does: data loading, forward, backward, the optimizer, logging.
The data wait is measured separately around the loader's ``next()``, which tells a starved GPU
from a slow model.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

from publisher.measure.budget import StepClock

T = TypeVar("T")

#: A training loop silent for this long (or 3 steps' time, if longer) counts as idle.
IDLE_AFTER_S = 2.0


class StepTimer:
    """When steps end, and how long they typically take.

    :attr:`last_at` is written by the training thread at each step (``Monitor.step``: the hang
    watchdog reads it, so it must be current); :meth:`observe` is the step worker's, in step order,
    with the time each step ended and the one before: :attr:`clock` (the typical step, which the
    cost budgets read) and :attr:`last_time` follow the steps one hand-off later (at most
    :data:`~publisher.wire.transport.HANDOFF_S`). Why not on the training thread: there, between
    training steps whose kernels have evicted the caches, keeping the clock cost ~3 us a step on a
    48-layer model (``benchmarks/step_floor.py``; the target is at most 15 us in all).
    """

    def __init__(self) -> None:
        self.clock = StepClock()
        #: When the latest step ended (``time.perf_counter``; the training thread's).
        self.last_at: float | None = None
        #: The raw time of the latest step observed (the typical one is ``clock.seconds``).
        self.last_time = 0.0
        #: The steps the clock has counted and when the latest of them ended, as one tuple so that
        #: another thread reads the two together (the watchdog: which count a pause follows).
        self.observed: tuple[int, float | None] = (0, None)
        self._pending_data_time: float | None = None
        #: How long :meth:`track`'s latest batch took to arrive.
        self.last_fetch_s = 0.0
        self._stopped = False

    def stop(self) -> None:
        """Training is over: :meth:`busy` says 0.0 from now on."""
        self._stopped = True

    def observe(self, at: float, previous: float | None) -> float | None:
        """A step ended at ``at``, the one before it at ``previous`` (None for the first): its
        seconds (step worker, in step order)."""
        elapsed = None if previous is None else at - previous
        if elapsed is not None:
            self.last_time = elapsed
            self.clock.observe(elapsed)
        self.observed = (self.clock.count, at)
        return elapsed

    def track(self, iterable: Iterable[T]) -> Iterator[T]:
        """Iterate ``iterable``, timing each fetch; :meth:`data_time` hands the last one over."""
        iterator = iter(iterable)
        while True:
            started = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                return
            self.last_fetch_s = time.perf_counter() - started
            self._pending_data_time = self.last_fetch_s
            yield item

    def data_time(self, given: float | None) -> float | None:
        """The step's data wait: ``given`` by the caller, else the one :meth:`track` measured."""
        if given is None:
            given, self._pending_data_time = self._pending_data_time, None
        return given

    def busy(self) -> float:
        """1.0 while steps keep coming, 0.0 once they stopped (a simulated GPU follows this)."""
        last = self.last_at
        if last is None or self._stopped:
            return 0.0
        idle_after = max(IDLE_AFTER_S, 3.0 * self.last_time)
        return 1.0 if time.perf_counter() - last < idle_after else 0.0
