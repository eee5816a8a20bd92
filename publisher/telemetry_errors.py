"""``TelemetryErrors``: failures of monitoring itself, part by part, each costing only its own figures.

A Monitor lives inside someone else's training run, so no failure of its own may reach that run
(OpenTelemetry's error-handling principle: instrumentation never throws into the application and
may lose its own data instead). tuimon promises more: a part that fails (the look at a loss call,
a per-layer sample, a memory reading, a detector) loses only its own figures for that step; the
step's metrics still go out, with the loss, and say which parts failed (``failed``,
docs/protocol.md).

Each part is a :class:`Part` handle, got once by name. Its first failure is logged and told as a
``telemetry_error`` event (info) naming the part, the exception and the step, so that it reaches
recordings, ``tuimon tail``, the dashboard and Prometheus rather than a log line alone. A part that
fails :data:`OFF_AFTER` times in a row, with no success between, is switched off for the run
(``Part.on`` turns False, the sites that run it stop calling it) and a second ``telemetry_error``,
a warning, says so. The total count is public (``Monitor.telemetry_errors``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: Failures in a row, with no success between, after which a part is switched off for the run.
OFF_AFTER = 20
#: Characters of an exception's text an event carries.
_ERROR_CHARS = 300

#: How a failure is told (set by the Monitor's wiring once its reporter exists): severity, the
#: message, the step, the details.
Report = Callable[[str, str, int | None, dict[str, Any]], None]


class Part:
    """One part of the Monitor, by name: whether it still runs (:attr:`on`), its failures in a row."""

    __slots__ = ("_errors", "can_stop", "failures", "name", "on", "streak")

    def __init__(self, name: str, errors: TelemetryErrors, can_stop: bool = True) -> None:
        self.name = name
        self._errors = errors
        #: False for a part the Monitor exists for (the loss): tried on every step, never switched off.
        self.can_stop = can_stop
        #: False once the part failed :data:`OFF_AFTER` times in a row: the sites skip it.
        self.on = True
        self.failures = 0
        self.streak = 0

    def ok(self) -> None:
        """The part ran: its failures are no longer in a row."""
        self.streak = 0

    def failed(self, exc: BaseException, step: int | None = None) -> None:
        """The part raised ``exc`` (on ``step``, where known): counted, told once, switched off
        after :data:`OFF_AFTER` in a row; never raises."""
        self._errors.part_failed(self, exc, step)


class TelemetryErrors:
    """Failures of monitoring itself: counted per part, told as events, none ever raised into training."""

    def __init__(self) -> None:
        self.count = 0
        self._parts: dict[str, Part] = {}
        self._lock = threading.Lock()
        self._report: Report | None = None
        #: What was to be told before there was a reporter (a failure while the Monitor is built).
        self._held: list[tuple[str, str, int | None, dict[str, Any]]] = []

    def part(self, name: str, *, can_stop: bool = True) -> Part:
        """The handle of the part called ``name`` (one per name); ``can_stop=False``: a part that is
        never switched off (the loss: what the Monitor exists to report)."""
        found = self._parts.get(name)
        if found is None:
            with self._lock:
                found = self._parts.setdefault(name, Part(name, self, can_stop))
        return found

    def failed(self, what: str, exc: BaseException, step: int | None = None) -> None:
        """The part called ``what`` raised ``exc`` (for the call sites that keep no handle)."""
        self.part(what).failed(exc, step)

    def report_to(self, report: Report) -> None:
        """Tell failures with ``report`` from now on, those held so far first."""
        with self._lock:
            self._report, held, self._held = report, self._held, []
        for told in held:
            self._tell(report, *told)

    def part_failed(self, part: Part, exc: BaseException, step: int | None) -> None:
        with self._lock:
            self.count += 1
            part.failures += 1
            part.streak += 1
            first, off = part.failures == 1, part.on and part.can_stop and part.streak >= OFF_AFTER
            if off:
                part.on = False
        if not (first or off):
            return
        error = f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS]
        at = "" if step is None else f" at step {step}"
        details = {"part": part.name, "error": error, "failures": part.failures}
        if off:
            message = (f"tuimon's {part.name} failed {part.streak} times in a row and is switched off for "
                       f"this run ({error}); the rest of the monitoring goes on")
            told = ("warning", message, step, {**details, "switched_off": True})
        else:
            message = (f"tuimon's {part.name} failed{at} ({error}); its figures are missing where it fails, "
                       "the step, the loss and every other part's figures still go out")
            told = ("info", message, step, {**details, "switched_off": False})
        log.warning("tuimon: %s", message.removeprefix("tuimon's "))
        with self._lock:
            report = self._report
            if report is None:
                self._held.append(told)
                return
        self._tell(report, *told)

    def _tell(self, report: Report, severity: str, message: str, step: int | None,
              details: dict[str, Any]) -> None:
        try:
            report(severity, message, step, details)
        except Exception:  # telling failed too: it stays counted and logged
            log.debug("tuimon: a telemetry_error event could not be published", exc_info=True)
