"""How long the training thread waited for a CPU: the run-queue delay Linux keeps for each thread.

``/proc/thread-self/schedstat`` holds three numbers for the calling thread: nanoseconds on a
CPU, nanoseconds runnable but waiting on a run queue, and timeslices (Linux
Documentation/scheduler/sched-stats.rst). Read with the memory readings (every 0.1 s), on the
training thread itself, the share of wall time spent waiting tells a loop that got slower by
itself (a debug routine per step: the share stays near zero) from one whose CPUs were taken by
other processes (the share rises towards ``1 - 1/slowdown``).
:class:`~publisher.detectors.speed.ThroughputDrop` judges the loop's own time with it, and names
lasting contention as such. Other systems have no such file: no metric.

Metric name: ``cpu_wait`` (share of the time since the previous reading, 0-1).
"""

from __future__ import annotations

#: The calling thread's scheduler statistics (Linux 3.17 and later).
SCHEDSTAT = "/proc/thread-self/schedstat"


#: Readings at least this far apart (a file read, ~10 us).
INTERVAL_S = 0.1


class CpuWait:
    """The share of time the calling thread waited for a CPU since its previous reading."""

    def __init__(self, path: str = SCHEDSTAT) -> None:
        self._path: str | None = path
        self._last: tuple[float, int] | None = None

    def read(self, now: float) -> dict[str, float]:
        """``{"cpu_wait": share}`` since the previous reading, if :data:`INTERVAL_S` ago or more
        (empty on the first call, sooner, or where the file does not exist, after which it is not
        tried again)."""
        if self._path is None or (self._last is not None and now - self._last[0] < INTERVAL_S):
            return {}
        try:
            waited = schedstat(self._path)[1]
        except (OSError, ValueError, IndexError):
            self._path = None
            return {}
        last, self._last = self._last, (now, waited)
        if last is None or now <= last[0]:
            return {}
        share = (waited - last[1]) / 1e9 / (now - last[0])
        return {"cpu_wait": min(max(share, 0.0), 1.0)}


def schedstat(path: str) -> tuple[int, int]:
    """A thread's ``schedstat`` file: (nanoseconds on a CPU, nanoseconds waiting on a run queue).
    Raises OSError, ValueError or IndexError where it cannot be read."""
    with open(path, "rb") as stats:
        fields = stats.read().split()
    return int(fields[0]), int(fields[1])
