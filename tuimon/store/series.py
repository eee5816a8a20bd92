"""A bounded (step, value) series: what the store keeps per metric and rank.

A run at 1,000 steps/s produces 3.6 million points an hour per metric; lists of tuples would cost
~100 bytes a point and a Python-level loop per chart redraw. Two flat arrays cost 16 bytes a point,
append at C speed and slice in one memory copy.
"""

from __future__ import annotations

import bisect
from array import array

#: Points kept per metric series at most (at least this many, up to twice as many between trims).
SERIES_CAPACITY = 120_000
#: Points the store keeps in all its series together; each series keeps its share
#: (:func:`share_of_points`), so however many series a peer makes, memory stays bounded.
TOTAL_POINTS = 8_000_000
#: A series keeps at least this many points, however many series share the total.
MIN_POINTS = 1_000


def share_of_points(series_count: int) -> int:
    """The capacity of each of ``series_count`` series: an equal share of :data:`TOTAL_POINTS`,
    between :data:`MIN_POINTS` and :data:`SERIES_CAPACITY`."""
    return max(MIN_POINTS, min(SERIES_CAPACITY, TOTAL_POINTS // max(1, series_count)))


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
            cut = len(self.steps) - self.capacity  # the capacity may have shrunk since the last cut
            del self.steps[:cut]
            del self.values[:cut]

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


class Ring:
    """The last ``size`` values of a signal in a float32 ring (a GPU's recent history): 4 bytes a
    value where a deque of Python floats costs 32, so thousands of GPUs stay cheap to keep."""

    __slots__ = ("_full", "_next", "_values")

    def __init__(self, size: int) -> None:
        self._values = array("f", bytes(4 * size))
        self._next = 0
        self._full = False

    def append(self, value: float) -> None:
        self._values[self._next] = value
        self._next += 1
        if self._next == len(self._values):
            self._next, self._full = 0, True

    def __len__(self) -> int:
        return len(self._values) if self._full else self._next

    def tolist(self) -> list[float]:
        """The values, oldest first."""
        if not self._full:
            return self._values[: self._next].tolist()
        return self._values[self._next:].tolist() + self._values[: self._next].tolist()
