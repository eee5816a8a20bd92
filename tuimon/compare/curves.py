"""When two runs' curves part: the one rule ``tuimon diff`` and ``--baseline`` share.

**Noise.** A run's noise at a step is how much its curve moves from one measured step to the next
around it, measured robustly: the median absolute step-to-step difference over the
:data:`HALF_WINDOW` differences on each side, scaled to a standard deviation
(:data:`MAD_TO_SIGMA`). A median ignores the odd spike that a standard deviation would follow
(Rousseeuw & Croux, "Alternatives to the Median Absolute Deviation", JASA 1993), and step-to-step
differences ignore the curve's slow descent that a deviation from its mean would count as noise.
Early in training, where the curve falls fast, the slope makes the differences larger: a run a
step or two behind another there is not called different.

**Parting.** At each compared step the watch takes the median of the two runs' differences over
the last :data:`WINDOW` compared steps. Two runs are apart at that step when this median exceeds
:data:`SIGMAS` standard errors of such a median, ``SIGMAS * sqrt(pi/2) * sqrt(noise_a**2 +
noise_b**2) / sqrt(n)`` over its ``n`` differences (and :data:`REL_FLOOR` of the values' size, so
rounding never counts); they *part* at the first of :data:`SUSTAIN` consecutive steps apart, or at
the first step where one value is NaN or infinite and the other is not, and are together again
after :data:`REJOIN` consecutive steps within the noise. A median over 16 steps
sees a difference of one noise deviation that lasts, which no single step shows, and is not moved
by one batch that lands differently; at five standard errors, chance alone parts two runs about
once in a million windows. A run held against a baseline (:mod:`tuimon.compare.band`) is watched
by the same rule with the baseline's noise standing for both runs'.

**Steps.** The steps compared are those the sparser run measured within both runs' ranges (the
gradient norm is measured on as many steps as a run's time budget allows, so a slowed run measures
it on fewer); the other run is read there, measured or by linear interpolation between the steps
it did measure. Never the other way round: a sparse curve read across a long gap is one straight
line, and a run of its interpolated values counts one chance deviation many times. Read at the
denser run's steps, two identical runs, one measuring every 16th step, parted in 38 of 200
simulated noisy curves; a CI run of ``tuimon diff`` on two seeded trainings, one slowed to 0.43x
by the machine's load, parted on ``grad_norm`` that way.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

#: Step-to-step differences on each side of a point that set its noise (33 points in all).
HALF_WINDOW = 16
#: From the median absolute step-to-step difference to a standard deviation: for independent
#: Gaussian noise of deviation s, x[t] - x[t-1] has deviation s*sqrt(2), whose median absolute
#: value is 0.6745 * s * sqrt(2).
MAD_TO_SIGMA = 1.0 / (0.6745 * math.sqrt(2.0))
#: Compared steps whose differences' median is judged (fewer at the start of a run).
WINDOW = 16
#: The standard error of the median of n Gaussian values is sqrt(pi/2) times that of their mean
#: (Kenney & Keeping, Mathematics of Statistics, 1962); for small n it is less, so this errs wide.
MEDIAN_ERROR = math.sqrt(math.pi / 2.0)
#: Standard errors beyond which the median difference counts as apart.
SIGMAS = 5.0
#: Consecutive compared steps apart that part two runs.
SUSTAIN = 3
#: Consecutive compared steps within the noise that end an episode apart: the whole window judged
#: anew, so that two runs about as far apart as the noise allows make one episode, not many.
REJOIN = WINDOW
#: Differences below this share of the values' size are rounding (float32 carries ~7 digits).
REL_FLOOR = 1e-6


@dataclass(frozen=True)
class Curve:
    """One run's measured (step, value) points of a metric, in step order, and its noise there."""

    steps: tuple[int, ...]
    values: tuple[float, ...]
    noise: tuple[float, ...]

    @classmethod
    def of(cls, steps: Sequence[int], values: Sequence[float]) -> Curve:
        """A curve from points in any order; a step measured twice keeps its last value."""
        latest = dict(zip(steps, values, strict=True))
        ordered = sorted(latest)
        kept = tuple(latest[step] for step in ordered)
        return cls(tuple(ordered), kept, tuple(noise_profile(kept)))

    def __len__(self) -> int:
        return len(self.steps)

    def at(self, step: int) -> tuple[float, float] | None:
        """(value, noise) at ``step``: measured, else interpolated between the measured steps
        around it (NaN when one of them is not finite); None outside the measured range."""
        steps = self.steps
        i = bisect.bisect_left(steps, step)
        if i < len(steps) and steps[i] == step:
            return self.values[i], self.noise[i]
        if i == 0 or i == len(steps):
            return None
        share = (step - steps[i - 1]) / (steps[i] - steps[i - 1])
        value = self.values[i - 1] + share * (self.values[i] - self.values[i - 1])
        noise = self.noise[i - 1] + share * (self.noise[i] - self.noise[i - 1])
        return value, noise

    def between(self, first: int, last: int) -> tuple[list[int], list[float]]:
        """The measured points from step ``first`` to ``last``."""
        start, stop = bisect.bisect_left(self.steps, first), bisect.bisect_right(self.steps, last)
        return list(self.steps[start:stop]), list(self.values[start:stop])


def running_medians(values: Sequence[float], count: int, before: int, after: int) -> list[float | None]:
    """For each ``i`` below ``count``, the median of the finite values among
    ``values[i - before : i + after]`` (None where there are none).

    A sorted window slides along (one insertion and one removal a point, found by bisection), so
    a million points take about a second, not the minute that sorting each window would.
    """
    window: list[float] = []
    medians: list[float | None] = []
    low = high = 0  # the window holds the finite values among values[low:high]
    for i in range(count):
        while high < min(len(values), i + after):
            if math.isfinite(values[high]):
                bisect.insort(window, values[high])
            high += 1
        while low < max(0, i - before):
            if math.isfinite(values[low]):
                del window[bisect.bisect_left(window, values[low])]
            low += 1
        size = len(window)
        if not size:
            medians.append(None)
        else:
            middle = size // 2
            medians.append(window[middle] if size % 2 else (window[middle - 1] + window[middle]) / 2)
    return medians


def noise_profile(values: Sequence[float]) -> list[float]:
    """The noise (a standard deviation) at each point: :data:`MAD_TO_SIGMA` times the median
    absolute step-to-step difference over the :data:`HALF_WINDOW` finite differences on each side
    (fewer at the ends; 0 where there are none)."""
    differences = [abs(b - a) for a, b in itertools.pairwise(values)]
    # Around point i, the differences ending at points i-HALF_WINDOW+1 .. i+HALF_WINDOW.
    medians = running_medians(differences, len(values), HALF_WINDOW, HALF_WINDOW)
    return [MAD_TO_SIGMA * median if median is not None else 0.0 for median in medians]


def allowance(noise_a: float, noise_b: float, count: int, size: float) -> float:
    """How far the median of ``count`` differences between two runs may be from 0 and still be
    noise, where their noises are ``noise_a`` and ``noise_b`` and their values about ``size``."""
    error = MEDIAN_ERROR * math.hypot(noise_a, noise_b) / math.sqrt(max(count, 1))
    return max(SIGMAS * error, REL_FLOOR * abs(size))


@dataclass(frozen=True)
class Apart:
    """A step where two runs were apart: their values there, the median difference over the
    window judged (``a - b``; NaN when one value is not finite) and how far it could have been."""

    step: int
    a: float
    b: float
    difference: float
    allowed: float

    @property
    def times(self) -> float:
        """The median difference in allowances (``inf`` when one value is not finite)."""
        if not math.isfinite(self.difference):
            return math.inf
        return abs(self.difference) / self.allowed if self.allowed > 0 else math.inf


class PartingWatch:
    """Follows two runs step by step and says when they part, and when they come back together.

    :meth:`observe` returns the first step of an episode apart once it is confirmed (after
    :data:`SUSTAIN` consecutive steps apart, or at once when one value is not finite and the other
    is); the episode ends after :data:`REJOIN` consecutive steps within the noise, and a later
    parting is a new episode. Steps where both values are NaN or infinite are skipped: both runs
    are broken there.
    """

    def __init__(self) -> None:
        self.parted = False
        #: The step the last episode ended on (the first of the steps back together).
        self.rejoined: int | None = None
        self._differences: deque[float] = deque(maxlen=WINDOW)
        self._first: Apart | None = None
        self._outside = 0
        self._inside = 0
        self._first_inside = 0

    def observe(self, step: int, a: float, b: float, noise_a: float, noise_b: float) -> Apart | None:
        finite_a, finite_b = math.isfinite(a), math.isfinite(b)
        if not (finite_a or finite_b):
            return None
        if finite_a != finite_b:
            return self._apart(Apart(step, a, b, math.nan, math.nan), at_once=True)
        self._differences.append(a - b)
        median = statistics.median(self._differences)
        limit = allowance(noise_a, noise_b, len(self._differences), max(abs(a), abs(b)))
        if abs(median) > limit:
            return self._apart(Apart(step, a, b, median, limit), at_once=False)
        self._outside = 0
        if self._inside == 0:
            self._first_inside = step
        self._inside += 1
        if self.parted and self._inside >= REJOIN:
            self.parted, self.rejoined = False, self._first_inside
        return None

    def _apart(self, found: Apart, *, at_once: bool) -> Apart | None:
        self._inside = 0
        if self._outside == 0:
            self._first = found
        self._outside += 1
        if self.parted or not (at_once or self._outside >= SUSTAIN):
            return None
        self.parted, self.rejoined = True, None
        return self._first


def compared(a: Curve, b: Curve) -> Iterator[tuple[int, float, float, float, float]]:
    """``(step, a, b, noise_a, noise_b)`` at every step the sparser curve measured within both
    curves' ranges, in step order (the module's docstring: why not the denser one's)."""
    if not a.steps or not b.steps:
        return
    low, high = max(a.steps[0], b.steps[0]), min(a.steps[-1], b.steps[-1])
    steps_a = [s for s in a.steps if low <= s <= high]
    steps_b = [s for s in b.steps if low <= s <= high]
    for step in min(steps_a, steps_b, key=len):
        at_a, at_b = a.at(step), b.at(step)
        if at_a is not None and at_b is not None:
            yield step, at_a[0], at_b[0], at_a[1], at_b[1]


@dataclass(frozen=True)
class Parting:
    """Where two curves first part (None: never beyond noise), over how many compared steps, and
    the step they came back together on if they were together again at the end."""

    first: Apart | None
    steps_compared: int
    rejoined: int | None


def first_parting(a: Curve, b: Curve) -> Parting:
    """Where ``a`` and ``b`` first part, by :class:`PartingWatch`'s rule."""
    watch = PartingWatch()
    first: Apart | None = None
    count = 0
    for step, value_a, value_b, noise_a, noise_b in compared(a, b):
        count += 1
        found = watch.observe(step, value_a, value_b, noise_a, noise_b)
        if first is None:
            first = found
    return Parting(first, count, watch.rejoined if first is not None else None)
