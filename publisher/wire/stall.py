"""What "stalled" means, said once for the publisher, the relays and the viewer.

A rank is **stalled** when its training thread has finished no step for :func:`threshold_s`:
``hang_after_s`` when the user fixed it, else ``max(FLOOR_S, TYPICAL_STEPS x the typical step)``,
so that a run of 30 s steps is not called stalled at 5 s (NVIDIA Resiliency Extension's fault
tolerance derives its timeouts from "observed heartbeat intervals" the same way:
https://nvidia.github.io/nvidia-resiliency-ext/fault_tolerance/integration/heartbeats.html).

The publisher's watchdog (:mod:`publisher.threads.watchdog`) starts reading the training thread
from :data:`CAPTURE_FROM` of the threshold on, about once a second: its Python stack, its CPU time
and run-queue wait (``/proc/<pid>/task/<tid>/schedstat``) and the bytes it read or wrote
(``/proc/<pid>/task/<tid>/io``). Heartbeats carry what it read (docs/protocol.md, ``heartbeat``),
so that the first judgement at the threshold already compares two captures or more, and
:func:`judge` turns those fields into a :class:`Stall`, one of:

- ``waiting``: the innermost frames are inside a collective (``in_collective``). The thread waits
  for another rank that has not joined; it is not hung itself (the rank outside the collective
  is: PyTorch's Flight Recorder names the rank missing from a collective after the fact,
  https://docs.pytorch.org/tutorials/prototype/flight_recorder_tutorial.html).
- ``stuck``: blocked in one place: over the latest :data:`CAPTURE_FROM` of the threshold it spent
  less than :data:`STUCK_CPU_SHARE` of the wall time on a CPU or waiting for one, did less than
  :data:`STUCK_IO_BYTES_PER_S` of I/O, and its innermost frame of user code did not move between
  captures. A thread in ``time.sleep``, a lock, a socket read or a queue ``get`` reads as stuck;
  where CPU and I/O are not known (not Linux), a stack that does not move does.
- ``busy``: working elsewhere: using a CPU, doing I/O, or moving through the code (a validation
  pass, a checkpoint being written, ``torch.compile`` or autotuning). A busy Python loop shows a
  CPU share near 1 even on a loaded machine, as waiting for a CPU counts as wanting one. A thread
  waiting in the DataLoader for its worker processes while they work (``workers_cpu``: workers
  restarting at an epoch's start, a slow first batch) waits for data and is busy too; workers that
  use no CPU (one of them hung, or blocked on storage) leave it stuck.
- ``ok``: not stalled (fewer than :func:`threshold_s` seconds without a step).

How loud each state is (:meth:`Stall.severity`; the events the publisher sends and why these
numbers: docs/detectors.md, "Stalls"): ``stuck`` is a ``warning`` at the threshold and
``critical`` from :data:`CRITICAL_AFTER` thresholds on; ``waiting`` is ``info``; ``busy`` is
``info`` once it outlasts :data:`BUSY_NOTE_OVER` x every earlier pause (so a periodic validation
is noted once, not at every pass) and a ``warning`` past :data:`BUSY_WARN_OVER` x
max(threshold, longest earlier pause): far beyond anything the run has shown.

Pure: no threads, no torch, no clock; the same inputs give the same verdict everywhere.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: No step for this long counts as stalled at least (the adaptive threshold's floor).
FLOOR_S = 5.0
#: ... or for this many typical steps, when that is longer.
TYPICAL_STEPS = 10.0
#: Share of the threshold from which the watchdog reads the training thread (stack, CPU, I/O),
#: and the span over which it compares its readings.
CAPTURE_FROM = 0.5
#: Under this share of its wall time on a CPU or waiting for one, a thread is not computing
#: (a thread in ``time.sleep`` or a lock shows ~0; a busy Python loop ~1).
STUCK_CPU_SHARE = 0.2
#: Under this many bytes read or written a second, a thread is not doing I/O either (a checkpoint
#: write moves megabytes a second; a thread blocked on a socket or a lock moves none).
STUCK_IO_BYTES_PER_S = 64 * 1024
#: A stuck thread is ``critical`` once stalled this many thresholds (20 s at the 5 s floor).
CRITICAL_AFTER = 4.0
#: A busy pause is noted (``info``) once it lasts this many times the longest earlier pause.
BUSY_NOTE_OVER = 1.5
#: A busy pause is a ``warning`` past this many times max(threshold, the longest earlier pause).
BUSY_WARN_OVER = 10.0

OK, BUSY, STUCK, WAITING = "ok", "busy", "stuck", "waiting"
STATES = (OK, BUSY, STUCK, WAITING)

#: Heartbeat fields :func:`judge` reads (docs/protocol.md); a relay folding heartbeats into its
#: summaries keeps these.
BEAT_FIELDS = ("stalled_s", "stall_after_s", "stack", "in_collective", "cpu_share",
               "io_bytes_per_s", "workers_cpu", "same_place")

#: Files that are not the user's code: installed packages, the standard library, frozen modules
#: (``<string>`` is: ``python -c``), and this project's own (its wrappers sit between a training
#: loop and its data loader).
_LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python\d+(\.\d+)?/|^<frozen ")
_OWN = str(Path(__file__).resolve().parents[1]) + "/"
_ENTRY = re.compile(r"^(?P<file>.+):(?P<line>\d+|None) (?P<function>\S+)$")
#: The standard library's files (not the packages installed beside it).
_STDLIB = re.compile(r"/lib/python\d+(\.\d+)?/(?!(site|dist)-packages/)")


def threshold_s(typical_step_s: float | None, after_s: float | None = None, *,
                floor_s: float = FLOOR_S) -> float:
    """Seconds without a step after which a rank is stalled: ``after_s`` when given (the user's
    ``hang_after_s``), else ``max(floor_s, TYPICAL_STEPS x typical_step_s)`` (the floor while no
    typical step is known: before the second step). ``floor_s`` is :data:`FLOOR_S` but in tests."""
    if after_s is not None:
        return after_s
    if typical_step_s is None or not math.isfinite(typical_step_s):
        return floor_s
    return max(floor_s, TYPICAL_STEPS * typical_step_s)


def pause_s(typical_step_s: float | None, after_s: float | None = None) -> float:
    """A step at least this long is a *pause*: :data:`CAPTURE_FROM` of the threshold, from where
    the watchdog reads the thread. Its verdict is this module's; speed detectors leave pauses out
    of their baselines and rates (a validation pass is no throughput drop)."""
    return CAPTURE_FROM * threshold_s(typical_step_s, after_s)


@dataclass(frozen=True, slots=True)
class Frame:
    """One stack entry read back: ``file`` as recorded, ``line`` (None when unknown), ``function``."""

    file: str
    line: int | None
    function: str

    @property
    def user(self) -> bool:
        """Whether this is the user's code (not an installed package, the standard library, or
        tuimon's own)."""
        path = self.file.replace("\\", "/")
        return not (_LIBRARY.search(path) or path.startswith(_OWN))

    def __str__(self) -> str:
        """``fetch_batch (train.py:4)``: the function, then the file's name and the line."""
        name = self.file.replace("\\", "/").rpartition("/")[2]
        return f"{self.function} ({name}:{self.line if self.line is not None else '?'})"


def parse_entry(entry: str) -> Frame | None:
    """A ``"file:line function"`` stack entry (docs/protocol.md) as a :class:`Frame`; None for
    anything else (the "outer frames left out" note, a malformed entry)."""
    match = _ENTRY.match(entry)
    if match is None:
        return None
    line = match["line"]
    return Frame(match["file"], None if line == "None" else int(line), match["function"])


def innermost(stack: Sequence[str], *, user: bool = False) -> Frame | None:
    """The innermost frame of ``stack`` (innermost last, as heartbeats carry it), or with ``user``
    the innermost frame of the user's code (:attr:`Frame.user`); None when there is none."""
    for entry in reversed(stack):
        frame = parse_entry(entry)
        if frame is not None and (not user or frame.user):
            return frame
    return None


@dataclass(frozen=True, slots=True)
class Stall:
    """A verdict on one rank's training thread (:func:`judge`).

    ``state``: one of :data:`STATES`. ``stalled_s``: seconds since its last step; ``threshold_s``:
    the threshold it was judged against. ``where``: the innermost frame of the user's code,
    ``"fetch_batch (train.py:4)"``; ``innermost``: the innermost frame overall (a library's:
    ``"sleep (time.py:?)"`` is never seen, C functions have no frame, so it is the last Python
    one); both None when no stack was read. ``in_collective``, ``cpu_share``,
    ``io_bytes_per_s``, ``workers_cpu``, ``same_place``: the heartbeat's readings (None when
    absent). ``stack``:
    the stack as read, innermost last.
    """

    state: str
    stalled_s: float
    threshold_s: float
    where: str | None = None
    innermost: str | None = None
    in_collective: bool | None = None
    cpu_share: float | None = None
    io_bytes_per_s: float | None = None
    workers_cpu: float | None = None
    same_place: bool | None = None
    stack: tuple[str, ...] = ()

    @property
    def stalled(self) -> bool:
        """Whether the thread is past the threshold (any state but ``ok``)."""
        return self.state != OK

    def severity(self, longest_pause_s: float | None = None) -> str | None:
        """How loud this stall is, None when it is not worth an event (yet).

        ``longest_pause_s``: the longest earlier pause of the run (a step at least
        :data:`CAPTURE_FROM` of the threshold long), which a ``busy`` pause is measured against;
        None or 0 when there was none.
        """
        if self.state == STUCK:
            return "critical" if self.stalled_s >= CRITICAL_AFTER * self.threshold_s else "warning"
        if self.state == WAITING:
            return "info"
        if self.state == BUSY:
            longest = longest_pause_s or 0.0
            if self.stalled_s >= BUSY_WARN_OVER * max(self.threshold_s, longest):
                return "warning"
            if self.stalled_s >= BUSY_NOTE_OVER * longest:
                return "info"
        return None

    def describe(self) -> str:
        """A few words for a header or a message: ``stuck 12 s in fetch_batch (train.py:4)``,
        ``busy 9 s in validate (train.py:30)``, ``waiting 7 s in all_reduce (distributed_c10d.py:2800)``
        (a wait names the collective, the innermost frame); ``stalled 6 s`` without a stack."""
        word = "stalled" if self.state == OK else self.state
        place = self.innermost if self.state == WAITING else self.where or self.innermost
        return f"{word} {self.stalled_s:.0f} s" + (f" in {place}" if place else "")


def judge(beat: Mapping[str, Any], threshold: float | None = None) -> Stall:
    """The verdict on a rank from one heartbeat's fields (or anything holding :data:`BEAT_FIELDS`).

    ``threshold``: seconds; None for the heartbeat's own ``stall_after_s`` (the publisher's,
    which knows its typical step best), else :data:`FLOOR_S`. A relay that measures the stall
    itself passes ``{**beat, "stalled_s": seconds_since_the_step_advanced}``. Fields that are
    absent or of the wrong type count as unknown, never as an error: heartbeats of older
    publishers carry only ``stalled_s``, ``stack`` and ``in_collective``, and such a stall with
    nothing else known reads as ``stuck`` (as all stalls did before).
    """
    after = threshold if threshold is not None else _number(beat.get("stall_after_s"))
    after = after if after is not None and after > 0 else FLOOR_S
    stalled = _number(beat.get("stalled_s")) or 0.0
    raw_stack = beat.get("stack")
    stack = tuple(e for e in raw_stack if isinstance(e, str)) if isinstance(raw_stack, list | tuple) else ()
    user, inner = innermost(stack, user=True), innermost(stack)
    in_collective = _flag(beat.get("in_collective"))
    cpu, io = _number(beat.get("cpu_share")), _number(beat.get("io_bytes_per_s"))
    workers, same = _number(beat.get("workers_cpu")), _flag(beat.get("same_place"))
    state = OK
    if stalled >= after:
        if in_collective:
            state = WAITING
        elif (cpu is not None and cpu >= STUCK_CPU_SHARE) or (io is not None and io >= STUCK_IO_BYTES_PER_S):
            state = BUSY
        elif workers is not None and workers >= STUCK_CPU_SHARE and _waits_for_workers(stack):
            state = BUSY  # waiting for data its DataLoader workers are busy making
        elif same is False:
            state = BUSY  # no CPU, but moving through the code: working slowly, not blocked
        else:
            state = STUCK
    return Stall(
        state, stalled, after,
        where=str(user) if user else None, innermost=str(inner) if inner else None,
        in_collective=in_collective, cpu_share=cpu, io_bytes_per_s=io, workers_cpu=workers,
        same_place=same, stack=stack,
    )


def _waits_for_workers(stack: Sequence[str]) -> bool:
    """Whether the innermost frame outside the standard library (a queue's ``get``, a
    connection's ``poll``) is torch's DataLoader, waiting for its worker processes."""
    for entry in reversed(stack):
        if not _STDLIB.search(entry.replace("\\", "/")):
            return "/torch/utils/data/" in entry.replace("\\", "/")
    return False


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _flag(value: object) -> bool | None:
    return value if isinstance(value, bool) else None
