"""What another thread of this process has used: CPU time (running or waiting to run) and I/O.

The hang watchdog tells a stuck training thread (blocked in a lock, a socket, ``time.sleep``) from
a busy one (a validation pass, a checkpoint being written) by what the thread used between two
readings. Linux keeps both per thread, readable by the process itself without touching the
thread:

- ``/proc/<pid>/task/<tid>/schedstat``: nanoseconds on a CPU and nanoseconds runnable but waiting
  on a run queue (Linux Documentation/scheduler/sched-stats.rst). Their sum is the time the
  thread *wanted* a CPU, so a busy thread on a loaded machine still reads as busy; a blocked one
  adds nothing to either. Where the file is missing, ``stat``'s ``utime`` + ``stime`` (clock ticks,
  proc(5)) stand in, without the wait.
- ``/proc/<pid>/task/<tid>/io``: bytes the thread read and wrote through system calls
  (``rchar``, ``wchar``) and those it caused the storage layer to fetch or dirty (``read_bytes``,
  ``write_bytes``, counted page by page while one long ``write`` is still under way) (proc(5)).
- ``/proc/<pid>/task/<tid>/children`` and each child's ``schedstat`` (or ``stat``): the CPU time
  wanted by the processes the thread started and that still run, its DataLoader workers (a thread
  waiting for workers that are busy loading is waiting for data, not stuck).

``<tid>`` is the kernel's id of the thread (:attr:`threading.Thread.native_id`), which
:func:`native_id` finds for a Python thread id among the threads :mod:`threading` knows, so that
the training thread never has to say it (its cost stays one attribute store per step).
Other systems have no such files: :meth:`ThreadUsage.read` then returns None and the watchdog
judges from the stack alone.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from publisher.readings.cpu_wait import schedstat

_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 1e7


def native_id(ident: int) -> int | None:
    """The kernel's id of the Python thread ``ident`` (:func:`threading.get_ident`), None when
    :mod:`threading` does not know it (a thread started outside Python that never asked)."""
    for thread in threading.enumerate():
        if thread.ident == ident:
            return thread.native_id
    return None


@dataclass(frozen=True, slots=True)
class Usage:
    """Counters of one thread at one moment: CPU nanoseconds wanted (run + run-queue wait, or
    run only without schedstat), and bytes read and written (syscalls, storage); None where the
    file could not be read."""

    cpu_ns: int | None
    read: tuple[int, int] | None
    written: tuple[int, int] | None
    #: CPU nanoseconds wanted by each live child process (pid -> ns), None where unknown.
    children: dict[int, int] | None = None

    def children_since(self, earlier: Usage) -> float | None:
        """CPU seconds the thread's child processes used since ``earlier`` (those alive at both
        readings: a worker that started or ended in between is left out)."""
        if self.children is None or earlier.children is None:
            return None
        return sum(max(0, ns - earlier.children[pid]) for pid, ns in self.children.items()
                   if pid in earlier.children) / 1e9

    def since(self, earlier: Usage) -> tuple[float | None, int | None]:
        """(CPU seconds, I/O bytes) used between ``earlier`` and this reading. Bytes count the
        larger of the syscall and storage figures for each direction: a write to the page cache
        shows in ``wchar`` once it returns, in ``write_bytes`` while it goes on."""
        cpu = None
        if self.cpu_ns is not None and earlier.cpu_ns is not None:
            cpu = max(0, self.cpu_ns - earlier.cpu_ns) / 1e9
        if self.read is None or self.written is None or earlier.read is None or earlier.written is None:
            return cpu, None
        moved = sum(
            max(0, max(now[0] - then[0], now[1] - then[1]))
            for now, then in ((self.read, earlier.read), (self.written, earlier.written))
        )
        return cpu, moved


class ThreadUsage:
    """Reads :class:`Usage` of the thread whose kernel id is ``tid``, in this process. A file that
    cannot be read once is not tried again."""

    def __init__(self, tid: int, *, proc: str = "/proc/self/task") -> None:
        self._schedstat: str | None = f"{proc}/{tid}/schedstat"
        self._stat: str | None = f"{proc}/{tid}/stat"
        self._io: str | None = f"{proc}/{tid}/io"
        self._children: str | None = f"{proc}/{tid}/children"

    def read(self) -> Usage:
        return Usage(self._cpu_ns(), *self._io_bytes(), self._children_ns())

    def _children_ns(self) -> dict[int, int] | None:
        if self._children is None:
            return None
        try:
            with open(self._children, "rb") as children:
                pids = [int(pid) for pid in children.read().split()]
        except (OSError, ValueError):
            self._children = None
            return None
        used = {}
        for pid in pids:
            try:
                ran, waited = schedstat(f"/proc/{pid}/schedstat")
                used[pid] = ran + waited
            except (OSError, ValueError, IndexError):
                try:
                    used[pid] = _stat_cpu_ns(f"/proc/{pid}/stat")
                except (OSError, ValueError, IndexError):
                    continue  # it ended meanwhile
        return used


    def _cpu_ns(self) -> int | None:
        if self._schedstat is not None:
            try:
                ran, waited = schedstat(self._schedstat)
                return ran + waited
            except (OSError, ValueError, IndexError):
                self._schedstat = None
        if self._stat is not None:
            try:
                return _stat_cpu_ns(self._stat)
            except (OSError, ValueError, IndexError):
                self._stat = None
        return None

    def _io_bytes(self) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
        if self._io is None:
            return None, None
        try:
            with open(self._io, "rb") as io:
                counters = dict(line.split(b":", 1) for line in io.read().splitlines() if b":" in line)
            read = int(counters[b"rchar"]), int(counters[b"read_bytes"])
            written = int(counters[b"wchar"]), int(counters[b"write_bytes"])
        except (OSError, ValueError, KeyError):
            self._io = None
            return None, None
        return read, written


def _stat_cpu_ns(path: str) -> int:
    """``utime`` + ``stime`` of a ``stat`` file (proc(5)), in nanoseconds."""
    with open(path, "rb") as stat:
        fields = stat.read().rpartition(b")")[2].split()
    return int((int(fields[11]) + int(fields[12])) * _TICK_NS)
