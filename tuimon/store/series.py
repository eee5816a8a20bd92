"""A bounded (step, value) series: what the store keeps per metric and rank.

A run at 1,000 steps/s produces 3.6 million points an hour per metric; lists of tuples would cost
~100 bytes a point and a Python-level loop per chart redraw. Two flat arrays cost 16 bytes a point,
append at C speed and slice in one memory copy.
"""

from __future__ import annotations

import bisect
from array import array

#: Points kept per metric series (at least this many; up to twice as many between trims).
SERIES_CAPACITY = 120_000


class Series:
    """A bounded (step, value) series with amortised O(1) appends.

    Two flat arrays grow to twice the capacity, then the oldest half is cut in one move, so an
    append is a C-level array append almost always and readers can slice without copying dicts.
    """

    __slots__ = ("capacity", "steps", "values")

    def __init__(self, capacity: int = SERIES_CAPACITY) -> None:
        self.capacity = capacity
        self.steps: array[int] = array("q")
        self.values: array[float] = array("d")

    def append(self, step: int, value: float) -> None:
        self.steps.append(step)
        self.values.append(value)
        if len(self.steps) >= 2 * self.capacity:
            del self.steps[: self.capacity]
            del self.values[: self.capacity]

    def __len__(self) -> int:
        return len(self.steps)

    def last(self) -> tuple[int, float] | None:
        return (self.steps[-1], self.values[-1]) if self.steps else None

    def tail(self, count: int | None = None) -> tuple[array[int], array[float]]:
        """Copies of the last ``count`` points (all when None): flat arrays, a memory copy each,
        so that a chart can take 200k points without holding the store's lock for long."""
        start = 0 if count is None else max(0, len(self.steps) - count)
        return self.steps[start:], self.values[start:]

    def between(self, first_step: int, last_step: int) -> tuple[list[int], list[float]]:
        """Copies of the points with ``first_step <= step <= last_step`` (steps are ascending)."""
        lo = bisect.bisect_left(self.steps, first_step)
        hi = bisect.bisect_right(self.steps, last_step)
        return self.steps[lo:hi].tolist(), self.values[lo:hi].tolist()
