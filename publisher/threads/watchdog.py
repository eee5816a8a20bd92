"""``HangWatchdog``: a thread that notices when training stops stepping and says where it is stuck.

A hung rank cannot report itself: its training thread is blocked (in a collective, a data loader,
a file system call). Heartbeats come from the publisher's own thread, so a viewer already sees that
a rank is alive but not stepping (NVIDIA Resiliency Extension's fault tolerance reaches the same
verdict from heartbeats the training sends itself, with timeouts "calculated based on observed
heartbeat intervals":
https://nvidia.github.io/nvidia-resiliency-ext/fault_tolerance/integration/heartbeats.html). What
only the process itself can add is *where* the training thread is: this thread reads the training
thread's Python stack from the outside (:mod:`publisher.threads.stacks`) once no step has
completed for longer than a threshold, and the heartbeat carries it
(:meth:`HangWatchdog.heartbeat_fields`, called on the publisher's thread).

The threshold is fixed (``after_s``) or adapts to the run: ``max(floor_s, 10 x the typical step)``,
the typical step being the median of the recent ones (:class:`~publisher.measure.budget.StepClock`),
so that a run of 30 s steps is not called stuck at 5 s; relays judge hangs with the same rule
(``tuimon/relay/watch.py``). Until the second step no typical step is known and the floor applies.

Cost while healthy: the thread wakes about once a second, reads the last step's time and the typical
step, and sleeps again; the training thread pays one attribute store per step (:attr:`thread_id`).
While stalled it captures at most every :data:`RECAPTURE_S` seconds.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from publisher.readings.timing import StepTimer
from publisher.threads.stacks import Stack, capture

log = logging.getLogger(__name__)

#: No step for this long counts as stalled at least (default threshold's floor).
FLOOR_S = 5.0
#: ... or for this many typical steps, when that is longer.
TYPICAL_STEPS = 10.0
#: How often the thread looks while training is healthy.
WAKE_S = 1.0
#: A stalled thread's stack is read again at most this often (it may move: a rank that was sleeping
#: may now wait in the collective).
RECAPTURE_S = 3.0


@dataclass(frozen=True)
class _Report:
    """A stack captured while the step that ended at ``step_at`` was the latest."""

    step_at: float
    taken_at: float
    stack: Stack


def check_after_s(value: object) -> float | None:
    """``hang_after_s`` as given to the Monitor: None (adaptive) or a positive number of seconds."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(f"hang_after_s must be a positive number of seconds or None, got {value!r}")
    return float(value)


class HangWatchdog:
    """Watches ``timer`` (the Monitor's step clock) for a stall of the thread :attr:`thread_id`.

    ``after_s``: a fixed threshold in seconds, or None for ``max(floor_s, typical_steps x the
    typical step)``. ``on_error`` is told about a failure of the watchdog itself (it carries on).
    """

    def __init__(
        self,
        timer: StepTimer,
        *,
        after_s: float | None = None,
        floor_s: float = FLOOR_S,
        typical_steps: float = TYPICAL_STEPS,
        wake_s: float = WAKE_S,
        recapture_s: float = RECAPTURE_S,
        on_error: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self._timer = timer
        self._after_s = check_after_s(after_s)
        self._floor_s = floor_s
        self._typical_steps = typical_steps
        self._wake_s = wake_s
        self._recapture_s = recapture_s
        self._on_error = on_error
        #: The training thread (``threading.get_ident()``), set by every step; None before the first.
        self.thread_id: int | None = None
        self._report: _Report | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> HangWatchdog:
        self._thread = threading.Thread(target=self._run, name="tuimon-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (heartbeats carry nothing from here on); idempotent."""
        self._stopping.set()
        self._report = None
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(2.0)

    def threshold(self) -> float:
        """Seconds without a step after which the training thread counts as stalled."""
        if self._after_s is not None:
            return self._after_s
        typical = self._timer.clock.seconds
        return self._floor_s if typical is None else max(self._floor_s, self._typical_steps * typical)

    # -- the publisher's thread -------------------------------------------------------------------

    def heartbeat_fields(self) -> dict[str, Any]:
        """What a heartbeat says about the training thread (docs/protocol.md): ``stalled_s`` once
        steps have started, and ``stack`` and ``in_collective`` while it is stalled past the
        threshold. A report older than the latest step is not sent: steps have resumed."""
        last = self._timer.last_at
        if last is None or self._stopping.is_set():
            return {}
        fields: dict[str, Any] = {"stalled_s": round(max(0.0, time.perf_counter() - last), 3)}
        report = self._report
        if report is not None and report.step_at == last:
            fields["stack"] = list(report.stack.entries)
            fields["in_collective"] = report.stack.in_collective
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
        last, thread_id = self._timer.last_at, self.thread_id
        if last is None or thread_id is None:
            return self._wake_s
        now = time.perf_counter()
        stalled, threshold = now - last, self.threshold()
        if stalled < threshold:
            self._report = None
            # Wake just as the threshold is crossed, so the stack is there for the next heartbeat.
            return min(self._wake_s, threshold - stalled + 0.01)
        report = self._report
        if report is None or report.step_at != last or now - report.taken_at >= self._recapture_s:
            stack = capture(thread_id)
            self._report = None if stack is None else _Report(last, now, stack)
        return self._wake_s
