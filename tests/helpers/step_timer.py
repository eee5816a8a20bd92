"""A step's end told to a :class:`StepTimer` as the Monitor tells it, both halves at once."""

from __future__ import annotations

import time

from publisher.readings.timing import StepTimer


def step_ended(timer: StepTimer) -> None:
    """A step ends now: the training thread's half (``last_at``, which the hang watchdog reads)
    and the step worker's (the step clock), as ``Monitor.step`` and its step worker do them."""
    now = time.perf_counter()
    previous, timer.last_at = timer.last_at, now
    timer.observe(now, previous)
