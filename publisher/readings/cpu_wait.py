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
from typing import BinaryIO

#: Where each thread's scheduler statistics are (Linux 2.6.9 and later), by kernel thread id.
TASKS = "/proc/self/task"

#: Readings at least this far apart (one ``pread`` of a file kept open, ~2 us).
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
        # (thread id, its schedstat open, its CPU nanoseconds at the last reading); a file object,
        # so that a CpuWait dropped without close() does not leak the descriptor.
        self._file: tuple[int, BinaryIO, int] | None = None

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
            waited = self._waited_ns(tid)
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

    def close(self) -> None:
        """Close the thread's statistics file (reading again reopens it)."""
        if self._file is not None:
            self._file[1].close()
            self._file = None

    def _waited_ns(self, tid: int) -> int:
        """Thread ``tid``'s run-queue nanoseconds: one ``pread`` of its ``schedstat``, kept open
        while the thread is the same and has run since the previous reading. Opening a ``/proc``
        file costs ten times the read (24 against 2 us here), and each of the three system calls
        hands the GIL to the training thread and back: read by the step worker, ~160 us a reading
        on this project's 2-core machine, ~30 us kept open (docs/benchmarks.md). A file kept open goes on
        reading an ended thread, frozen: a thread that has not run is looked up anew, which raises
        FileNotFoundError once it has ended (and finds the new thread where its id was reused)."""
        kept = self._file
        if kept is not None and kept[0] == tid:
            try:
                ran, waited = _parse(os.pread(kept[1].fileno(), 128, 0))
                if ran != kept[2]:
                    self._file = (tid, kept[1], ran)
                    return waited
            except (OSError, ValueError, IndexError):
                pass  # looked up anew below
        self.close()
        assert self._tasks is not None
        stats = open(f"{self._tasks}/{tid}/schedstat", "rb", buffering=0)  # noqa: SIM115 (kept open)
        ran, waited = _parse(os.pread(stats.fileno(), 128, 0))
        self._file = (tid, stats, ran)
        return waited


def schedstat(path: str) -> tuple[int, int]:
    """A thread's ``schedstat`` file: (nanoseconds on a CPU, nanoseconds waiting on a run queue).
    Raises OSError, ValueError or IndexError where it cannot be read."""
    with open(path, "rb") as stats:
        return _parse(stats.read())


def _parse(raw: bytes) -> tuple[int, int]:
    fields = raw.split()
    return int(fields[0]), int(fields[1])
