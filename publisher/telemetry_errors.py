"""``TelemetryErrors``: failures of monitoring itself, counted, the first one logged.

A Monitor lives inside someone else's training run, so no failure of its own may reach that run:
each part that fails (a reading on the training thread, publishing off it, the hang watchdog)
reports here instead of raising. The count is public (``Monitor.telemetry_errors``); only the
first failure is logged, so that a failure repeated on every step cannot flood the training's log.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class TelemetryErrors:
    """Failures of monitoring itself: counted, the first one logged, none ever raised into training."""

    def __init__(self) -> None:
        self.count = 0

    def failed(self, what: str, exc: BaseException) -> None:
        self.count += 1
        if self.count == 1:
            log.warning(
                "tuimon: %s failed (%s: %s); training continues, further telemetry errors are only counted",
                what,
                type(exc).__name__,
                exc,
            )
