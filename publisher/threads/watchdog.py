"""``HangWatchdog``: a thread that notices when training stops stepping, and reads where and how
the training thread is stopped.

A hung rank cannot report itself: its training thread is blocked (in a collective, a data loader,
a file system call). Heartbeats come from the publisher's own thread, so a viewer already sees that
a rank is alive but not stepping (NVIDIA Resiliency Extension's fault tolerance reaches the same
verdict from heartbeats the training sends itself, with timeouts "calculated based on observed
heartbeat intervals":
https://nvidia.github.io/nvidia-resiliency-ext/fault_tolerance/integration/heartbeats.html). What
only the process itself can add is *where* the training thread is and *what it does* there. From
half the threshold on (:data:`publisher.wire.stall.CAPTURE_FROM`), this thread reads about once a
second the training thread's Python stack from the outside (:mod:`publisher.threads.stacks`) and
its CPU time and I/O (:mod:`publisher.threads.thread_usage`), so that the first judgement, at the
threshold, already compares a few readings: blocked in one place with no CPU (stuck), working
(busy), or waiting inside a collective (:func:`publisher.wire.stall.judge`, the one definition the
relays and the viewer use too). Heartbeats carry the readings (:meth:`HangWatchdog.heartbeat_fields`,
called on the publisher's link thread, once per hand-off); a listener (:class:`StallListener`, the
stall events of :mod:`publisher.detectors.stall_events`) is told each verdict past the threshold,
and when steps resume.

The threshold is :func:`publisher.wire.stall.threshold_s`: fixed (``after_s``) or
``max(floor, 10 x the typical step)``, the typical step being the median of the recent ones
(:class:`~publisher.measure.budget.StepClock`). Until the second step the floor applies.

Cost while healthy: the thread wakes about once a second, reads the last step's time and the typical
step, and sleeps again; the training thread pays one attribute store per step (:attr:`thread_id`:
the kernel's id of that thread, for its CPU time, is looked up here, once per thread).
While stalled it reads the thread about once a second (a stack walk and two small files).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from publisher.readings.timing import StepTimer
from publisher.threads.daemon import daemon_thread
from publisher.threads.stacks import Stack, capture
from publisher.threads.thread_usage import ThreadUsage, Usage, native_id
from publisher.wire import stall as stalls
from publisher.wire.stall import Stall

log = logging.getLogger(__name__)

#: How often the thread looks while training is healthy, and reads the thread while it is stalled.
WAKE_S = 1.0


class StallListener(Protocol):
    """Told about the stalls the watchdog watched, on the watchdog's thread."""

    def stalled(self, stall: Stall) -> None:
        """A verdict on the current stall, at each look once it is past the threshold."""

    def resumed(self, length_s: float) -> None:
        """Steps resumed after a pause watched from half the threshold on (whether or not it
        reached the threshold), which lasted ``length_s`` seconds."""


@dataclass(frozen=True, slots=True)
class _Reading:
    taken_at: float
    stack: Stack | None
    place: str | None  # the innermost frame of user code
    usage: Usage | None


@dataclass
class _Watch:
    """One stall, watched from half the threshold on: the step it follows, the steps the step
    clock had counted with it (None until the step worker has observed it), and the readings of
    the latest half threshold (one older, to measure from)."""

    step_at: float
    steps: int | None = None
    readings: list[_Reading] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)

    def add(self, reading: _Reading, span_s: float) -> None:
        readings = self.readings
        readings.append(reading)
        while len(readings) > 2 and readings[1].taken_at <= reading.taken_at - span_s:
            del readings[0]
        self.fields = self._fields()

    def _fields(self) -> dict[str, Any]:
        """The heartbeat's fields from the readings (docs/protocol.md, ``heartbeat``)."""
        first, last = self.readings[0], self.readings[-1]
        fields: dict[str, Any] = {}
        if last.stack is not None:
            fields["stack"] = list(last.stack.entries)
            fields["in_collective"] = last.stack.in_collective
        if len(self.readings) < 2:
            return fields
        places = {r.place for r in self.readings if r.stack is not None}
        if places:
            fields["same_place"] = len(places) == 1
        span = last.taken_at - first.taken_at
        if last.usage is not None and first.usage is not None and span > 0:
            cpu, moved = last.usage.since(first.usage)
            if cpu is not None:
                fields["cpu_share"] = round(min(1.0, cpu / span), 3)
            if moved is not None:
                fields["io_bytes_per_s"] = round(moved / span)
            workers = last.usage.children_since(first.usage)
            if workers:
                fields["workers_cpu"] = round(workers / span, 3)
        return fields


def check_after_s(value: object) -> float | None:
    """``hang_after_s`` as given to the Monitor: None (adaptive) or a positive number of seconds."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(f"hang_after_s must be a positive number of seconds or None, got {value!r}")
    return float(value)


class HangWatchdog:
    """Watches ``timer`` (the Monitor's step clock) for a stall of the thread :attr:`thread_id`.

    ``after_s``: a fixed threshold in seconds, or None for the adaptive one
    (:func:`publisher.wire.stall.threshold_s`; ``floor_s`` is its floor, changed by tests only).
    ``world_size``: the job's ranks (in a job of several, a backward pass may wait for the others:
    :func:`publisher.threads.stacks.in_collective`). ``on_error`` is told about a failure of the
    watchdog itself (it carries on).
    """

    def __init__(
        self,
        timer: StepTimer,
        *,
        after_s: float | None = None,
        floor_s: float = stalls.FLOOR_S,
        world_size: int = 1,
        wake_s: float = WAKE_S,
        on_error: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self._timer = timer
        self._after_s = check_after_s(after_s)
        self._floor_s = floor_s
        self._in_job = world_size > 1
        self._wake_s = wake_s
        self._on_error = on_error
        #: The training thread (``threading.get_ident()``), set by every step; None before the first.
        self.thread_id: int | None = None
        self._usage: tuple[int, ThreadUsage | None] | None = None  # (thread_id, its reader)
        self._watch: _Watch | None = None
        self._listener: StallListener | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, listener: StallListener | None = None) -> HangWatchdog:
        """Start watching; ``listener`` is told each verdict past the threshold and each resume."""
        self._listener = listener
        self._thread = daemon_thread(self._run, "tuimon-watchdog")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (heartbeats carry nothing from here on); idempotent. A stall that ended
        since the last look (the run's last steps) is told to the listener first, once the
        watchdog's thread is gone."""
        self._stopping.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(2.0)
            watch, last = self._watch, self._timer.last_at
            if not thread.is_alive() and watch is not None and last is not None and watch.step_at != last:
                self._resumed(watch, last)
        self._watch = None

    def threshold(self) -> float:
        """Seconds without a step after which the training thread counts as stalled."""
        return stalls.threshold_s(self._timer.clock.seconds, self._after_s, floor_s=self._floor_s)

    # -- the publisher's link thread --------------------------------------------------------------

    def heartbeat_fields(self) -> dict[str, Any]:
        """What a heartbeat says about the training thread (docs/protocol.md): ``stalled_s`` and
        ``stall_after_s`` once steps have started, and from half the threshold on what the
        watchdog read (stack, ``in_collective``, ``cpu_share``, ``io_bytes_per_s``,
        ``same_place``). Readings older than the latest step are not sent: steps have resumed."""
        last = self._timer.last_at
        if last is None or self._stopping.is_set():
            return {}
        fields: dict[str, Any] = {
            "stalled_s": round(max(0.0, time.perf_counter() - last), 3),
            "stall_after_s": round(self.threshold(), 3),
        }
        watch = self._watch
        if watch is not None and watch.step_at == last:
            fields.update(watch.fields)
        return fields

    # -- the watchdog's thread --------------------------------------------------------------------

    def _run(self) -> None:
        wait = self._wake_s
        failed = False
        while not self._stopping.wait(wait):
            try:
                wait = self._look()
            except Exception as exc:  # a broken watchdog must never take the run with it
                wait = self._wake_s
                if not failed and self._on_error is not None:
                    failed = True
                    self._on_error("hang watchdog", exc)

    def _look(self) -> float:
        """One look at the training thread; returns how long to sleep before the next."""
        timer = self._timer
        last, thread_id = timer.last_at, self.thread_id
        if last is None or thread_id is None:
            return self._wake_s
        watch = self._watch
        if watch is not None and watch.step_at != last:
            self._watch = None
            self._resumed(watch, last)
        now = time.perf_counter()
        stalled, threshold = now - last, self.threshold()
        capture_from = stalls.CAPTURE_FROM * threshold
        if stalled < capture_from:
            # Wake just as reading starts, so that readings span half the threshold at the threshold.
            return min(self._wake_s, capture_from - stalled + 0.01)
        if watch is None or watch.step_at != last:
            watch = self._watch = _Watch(last)
        if watch.steps is None:
            counted, observed_at = timer.observed
            if observed_at == last:
                watch.steps = counted
        watch.add(self._read(thread_id, now), capture_from)
        verdict = stalls.judge({**watch.fields, "stalled_s": stalled}, threshold)
        if verdict.stalled and self._listener is not None:
            self._listener.stalled(verdict)
        return min(self._wake_s, threshold - stalled + 0.01) if stalled < threshold else self._wake_s

    def _read(self, thread_id: int, now: float) -> _Reading:
        if self._usage is None or self._usage[0] != thread_id:
            tid = native_id(thread_id)
            self._usage = (thread_id, ThreadUsage(tid) if tid is not None else None)
        reader = self._usage[1]
        usage = reader.read() if reader is not None else None
        stack = capture(thread_id, in_job=self._in_job)
        place = stalls.innermost(stack.entries, user=True) if stack is not None else None
        return _Reading(now, stack, str(place) if place else None, usage)

    def _resumed(self, watch: _Watch, last: float) -> None:
        """Steps resumed after ``watch``'s pause: tell the listener how long it lasted (the step
        that ended it, from the step clock; if over 30 steps went by since, the time to the latest
        step less the typical steps that followed). The step worker keeps the clock, one hand-off
        behind the steps: where it had not observed the step before the pause (a threshold under
        two hand-offs) or has not observed the one after (steps that resumed just before the run
        closed), the time to the latest step, long by the steps since."""
        clock = self._timer.clock
        took = None if watch.steps is None else clock.took(watch.steps)
        if took is not None:
            length = took
        else:
            followed = 0 if watch.steps is None else max(clock.count - watch.steps - 1, 0)
            length = last - watch.step_at - followed * (clock.seconds or 0.0)
        if self._listener is not None:
            self._listener.resumed(max(length, 0.0))
