"""Cost budgets: optional measurements spaced out so that on average they cost a set share of a step.

Three measurements are worth taking on every step but cost more than a small model's step can
spare on a CPU: the gradient norm (it reads every gradient), the per-layer samples (a few dozen
small kernels and hooks) and the training-invariant checks (Python work in the optimizer's hooks).
Each one times what it cost and, when its moving average exceeds its share of the typical step
time, waits proportionally longer before it runs again. On a GPU the kernels are only queued, the
costs are microseconds against steps of tens of milliseconds, and nothing is spaced out.

One :class:`StepClock` (the Monitor's) says how long a step typically takes; each measurement has
its own :class:`CostBudget`. The defaults add up to 1 % of the step time, so that with the rest of
the Monitor a 20 ms step stays within 1.02x (``benchmarks/overhead.py``): the gradient norm 0.5 %
(``Monitor(grad_norm_budget=)``), per-layer samples 0.25 % (``StatsConfig.budget``), invariant
checks 0.25 % (``InvariantConfig.budget``).
"""

from __future__ import annotations

import math
import time
from typing import Protocol


class QuietPart(Protocol):
    """A part of the Monitor that needs some steps and not others: after each full step it says
    how many coming steps need nothing of it (``idle_steps``), and the Monitor tells it at once
    that those will pass by its quiet path (``skip``; a negative count gives back those a quiet run
    that ended early did not take). The Monitor plans its quiet steps from one list of them."""

    def idle_steps(self) -> int:
        """Coming steps that need nothing of this part."""
        ...

    def skip(self, steps: int) -> None:
        """``steps`` coming steps pass by the quiet path (negative: that many did not)."""
        ...


def check_share(value: object, what: str) -> float:
    """``value`` as a share of the step time, or a ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(f"{what} must be a share of the step time in (0, 1], got {value!r}")
    return float(value)


class StepClock:
    """The typical duration of a training step, in seconds (None before the first one).

    The median of the latest :attr:`WINDOW` steps: evaluations, checkpoints, steps that carried a
    sample and other pauses, up to half of them, do not move it. Re-sorted every
    :attr:`REFRESH` steps only (the window fills at start-up, sorted at each step).
    """

    WINDOW = 31
    REFRESH = 8

    __slots__ = ("_count", "_recent", "seconds")

    def __init__(self) -> None:
        self.seconds: float | None = None
        self._recent: list[float] = []
        self._count = 0

    @property
    def count(self) -> int:
        """Steps observed so far (read from other threads: how many steps ended since a moment)."""
        return self._count

    def took(self, number: int) -> float | None:
        """How long the step observed ``number``-th (0 for the first) took, while it is among the
        latest :attr:`WINDOW`; None otherwise (read from other threads: the slot is checked to be
        still that step's after it is read)."""
        if not self._count - self.WINDOW <= number < self._count:
            return None
        elapsed = self._recent[number % self.WINDOW]
        return elapsed if number > self._count - self.WINDOW else None  # not being overwritten

    def observe(self, elapsed: float) -> None:
        """One step took ``elapsed`` seconds."""
        if elapsed <= 0:
            return
        recent, count = self._recent, self._count
        if count < self.WINDOW:
            recent.append(elapsed)
        else:
            recent[count % self.WINDOW] = elapsed
        self._count = count = count + 1
        if count <= self.WINDOW or count % self.REFRESH == 0:
            self.seconds = sorted(recent)[len(recent) // 2]


class CostBudget:
    """How many steps to leave between two runs of a measurement that may cost ``share`` of a step.

    :meth:`charge` each run's cost (everything it caused since the previous run, hooks included);
    :meth:`gap` is then at least ``every`` steps, more when the moving average of the cost exceeds
    ``share`` of the step time, and at most ``longest`` (a bound on how late the measurement can
    be, whatever it costs), nor more steps than fit in ``within_s`` seconds (at least one): where
    steps are long, ``every`` steps would be too late. The first ``cold`` charges are ignored: they
    pay one-off set-up (allocator, kernel selection, first calls of Python code), not the steady
    cost. ``share`` 1.0 turns the budget off (always ``every``).

    A charge counts for at most :attr:`OUTLIER` times the average so far: a run that a busy core
    descheduled or a garbage collection paused can take a thousand times its usual time, and
    averaged whole it would space the next runs a thousand-fold further (hundreds of times
    further, then slowly less: a gradient norm unmeasured for thousands of steps). A lasting rise
    is still followed, by up to ``1 + smoothing * (OUTLIER - 1)`` times a run.
    """

    #: How many times the average cost one charge can count for.
    OUTLIER = 4.0

    __slots__ = ("_cold", "_smoothing", "cost", "every", "longest", "share", "within_s")

    def __init__(self, share: float, *, every: int = 1, longest: int | None = None,
                 within_s: float | None = None, cold: int = 1, smoothing: float = 0.2,
                 what: str = "budget") -> None:
        self.share = check_share(share, what)
        self.every = every
        self.longest = longest
        self.within_s = within_s
        #: Seconds one run costs, moving average (None until measured).
        self.cost: float | None = None
        self._cold = cold
        self._smoothing = smoothing

    def charge(self, seconds: float) -> None:
        """What the latest run cost, in seconds."""
        if self._cold > 0:
            self._cold -= 1
            return
        cost = self.cost
        if cost is None:
            self.cost = seconds
        else:
            if cost > 0:
                seconds = min(seconds, self.OUTLIER * cost)
            self.cost = cost + self._smoothing * (seconds - cost)

    def gap(self, step_time: float | None) -> int:
        """Steps from this run to the next, for steps of ``step_time`` seconds (None: unknown)."""
        gap = self.every
        if self.share < 1.0 and self.cost is not None and step_time:
            gap = max(gap, math.ceil(self.cost / (self.share * step_time)))
        if self.longest is not None:
            gap = min(gap, max(self.longest, self.every))
        if self.within_s is not None and step_time:
            gap = min(gap, max(1, int(self.within_s / step_time)))
        return gap


class Schedule:
    """Which step indices a check runs on: the first ``dense`` ones, regular ones, and requests.

    Regular steps are ``every`` apart. :meth:`retime` changes the period from the next regular
    step on, so the step a check already planned for (its hooks may be armed) stays due.
    """

    def __init__(self, dense: int, every: int) -> None:
        self._dense = dense
        self.every = every
        self._anchor = 0  # a regular step; the others are every ``every`` from it
        self._requested: set[int] = set()

    def due(self, index: int) -> bool:
        return (index < self._dense or self.regular(index)
                or (bool(self._requested) and index in self._requested))

    def regular(self, index: int) -> bool:
        """Is ``index`` one of the periodic steps (not a dense one, not a request)?"""
        return index >= self._anchor and (index - self._anchor) % self.every == 0

    def next_due(self, index: int) -> int:
        """The first step index >= ``index`` that is due."""
        if index < self._dense:
            return index
        return min([self._next_regular(index), *(i for i in self._requested if i >= index)])

    def request(self, index: int) -> None:
        """Also run on step ``index`` (a check confirming a suspicion on the next step)."""
        self._requested = {i for i in self._requested if i >= index - 1}
        self._requested.add(index)

    def retime(self, every: int, index: int) -> None:
        """Make regular steps ``every`` apart from the first regular one >= ``index`` on."""
        if every != self.every:
            self._anchor = self._next_regular(index)
            self.every = every

    def _next_regular(self, index: int) -> int:
        anchor = self._anchor
        return anchor + -(-max(0, index - anchor) // self.every) * self.every


class CostMeter:
    """Wall time spent in the checker's hooks (``with meter:``), reported as its own overhead."""

    __slots__ = ("_depth", "_started", "spent_ns")

    def __init__(self) -> None:
        self.spent_ns = 0
        self._started = 0
        self._depth = 0

    def __enter__(self) -> None:
        if self._depth == 0:
            self._started = time.perf_counter_ns()
        self._depth += 1

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.spent_ns += time.perf_counter_ns() - self._started
