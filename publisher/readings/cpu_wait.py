"""How long the training thread waited for a CPU: the run-queue delay Linux keeps for each thread.

``/proc/self/task/<tid>/schedstat`` holds three numbers for one thread: nanoseconds on a CPU,
nanoseconds runnable but waiting on a run queue, and timeslices (Linux
Documentation/scheduler/sched-stats.rst). Read with the memory readings (every 0.1 s) by the step
worker for the training thread (any thread of the process may read another's), the share of wall
time spent waiting tells a loop that got slower by itself (a debug routine per step: the share
stays near zero) from one whose CPUs were taken by other processes (the share rises towards
``1 - 1/slowdown``). :class:`~publisher.detectors.speed.ThroughputDrop` judges the loop's own time
with it, and names lasting contention as such. Other systems have no such file: no metric.

Metric name: ``cpu_wait`` (share of the time since the previous reading, 0-1).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

#: Where each thread's scheduler statistics are (Linux 2.6.9 and later), by kernel thread id.
TASKS = "/proc/self/task"

#: Readings at least this far apart (a file read, ~10 us).
INTERVAL_S = 0.1


class CpuWait:
    """The share of time one thread waited for a CPU since its previous reading: the thread
    ``thread()`` names by its kernel id (:func:`threading.get_native_id`; None: unknown), by
    default the one that reads."""

    def __init__(self, thread: Callable[[], int | None] = threading.get_native_id,
                 tasks: str = TASKS) -> None:
        self._thread = thread
        self._tasks: str | None = tasks if os.path.isdir(tasks) else None
        self._last: tuple[int, float, int] | None = None

    def read(self, now: float) -> dict[str, float]:
        """``{"cpu_wait": share}`` since the previous reading of the same thread, if
        :data:`INTERVAL_S` ago or more (empty on the first call, sooner, for an unknown or ended
        thread, and where the statistics do not exist or cannot be read, after which they are not
        tried again)."""
        last = self._last
        if self._tasks is None or (last is not None and now - last[1] < INTERVAL_S):
            return {}  # before naming the thread, which may cost a scan of the process's threads
        tid = self._thread()
        if tid is None:
            return {}
        try:
            waited = schedstat(f"{self._tasks}/{tid}/schedstat")[1]
        except FileNotFoundError:  # the thread ended: the next one starts afresh
            self._last = None
            return {}
        except (OSError, ValueError, IndexError):
            self._tasks = None
            return {}
        self._last = (tid, now, waited)
        if last is None or last[0] != tid or now <= last[1]:
            return {}
        share = (waited - last[2]) / 1e9 / (now - last[1])
        return {"cpu_wait": min(max(share, 0.0), 1.0)}


def schedstat(path: str) -> tuple[int, int]:
    """A thread's ``schedstat`` file: (nanoseconds on a CPU, nanoseconds waiting on a run queue).
    Raises OSError, ValueError or IndexError where it cannot be read."""
    with open(path, "rb") as stats:
        fields = stats.read().split()
    return int(fields[0]), int(fields[1])
