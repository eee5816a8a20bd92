"""The header's throughput: samples (or tokens) a second over the last seconds, not one step's.

A single 64 ms step among 24 ms ones reads as a 2.6x slowdown if the latest value is shown. What a
person means by "how fast is it going" is the work done over the last seconds divided by those
seconds. With a constant batch, that is the harmonic mean of the steps' rates (each step's
samples over its time, summed, over the time summed), taken over the steps whose ``step_time``
adds up to :data:`WINDOW_S`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: Seconds of steps the figure is taken over.
WINDOW_S = 10.0
#: Steps taken when the run does not say how long its steps take.
STEPS_WITHOUT_TIMES = 20


@dataclass(frozen=True)
class Rate:
    """``value`` per second of metric ``name``, over the last ``steps`` steps (``seconds`` long,
    None when the run sends no step times)."""

    name: str
    value: float
    steps: int
    seconds: float | None

    def span(self) -> str:
        """What the figure is taken over, in words: ``10 s``, or ``20 steps`` (untimed or short)."""
        if self.seconds is not None and self.seconds >= 1:
            return f"{self.seconds:.0f} s"
        return f"{self.steps} step" + ("" if self.steps == 1 else "s")


def smoothed_rate(name: str, rates: Sequence[float], step_times: Sequence[float]) -> Rate | None:
    """The rate over the last :data:`WINDOW_S` of steps (``rates``: the metric's latest values,
    oldest first; ``step_times``: the latest ``step_time`` values, oldest first, maybe none)."""
    count, seconds = 0, 0.0
    for step_time in reversed(step_times):
        if not math.isfinite(step_time) or step_time <= 0:
            continue
        count += 1
        seconds += step_time
        if seconds >= WINDOW_S:
            break
    timed = count > 0
    if not timed:
        count = STEPS_WITHOUT_TIMES
    kept = [value for value in rates[-count:] if math.isfinite(value) and value > 0]
    if not kept:
        return None
    harmonic = len(kept) / sum(1.0 / value for value in kept)
    return Rate(name, harmonic, len(kept), seconds if timed else None)
