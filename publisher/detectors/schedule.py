"""The learning rate's course: a rate that decayed away while training goes on.

A scheduler meant to step once an epoch, stepped every batch (``StepLR(step_size=1, gamma=0.9)``
in the batch loop), takes a rate of 0.1 to 1e-14 within a few hundred steps. From then on every
update is smaller than the float resolution of the weights (``|lr * g| < eps * |w|``, eps = 1.2e-7
in float32), so ``w + dw == w``: gradients flow, the loss is finite and looks as if it has
settled, nothing is learned, and no other check speaks (the step still writes the weights, so
their version counters move, and an update ratio of exactly 0 is not a vanishing one). A rate
that reaches exactly 0 is the ``optimizer_changes_params`` invariant's (``optimizer_noop``).

Schedules approach 0 on purpose, but only at their planned end: below ``ratio`` (1e-4) of its
peak a cosine schedule spends its last 0.64 % of steps, a quadratic decay its last 1 %, a linear
one its last 0.01 %, and training then stops. So a rate is called vanished when it has stayed
below ``ratio`` of its peak for ``share`` (3 %) of the steps taken so far, and at least
``min_steps`` (50). Warm-up from 0 raises the peak as it goes (never low), and a group whose rate
was never positive (a frozen group) has no peak.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from publisher.detectors.base import Detector, Finding, Metrics, fmt, where

#: float32's resolution: an update below this share of a weight leaves the weight as it was.
FLOAT32_EPS = 2.0**-23


@dataclass
class _Course:
    """One param group's rate: its peak and the history worth telling."""

    peak: float = 0.0
    peak_step: int = 0
    low_since: int | None = None  # first step of the current stretch below ratio * peak
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, lr) each time it fell 10x


class LrVanished(Detector):
    """A learning rate that fell to a negligible share of its peak and stayed there."""

    quiet_to_close = 1

    def __init__(self, ratio: float = 1e-4, share: float = 0.03, min_steps: int = 50) -> None:
        self.ratio = ratio
        self.share = share
        self.min_steps = min_steps
        self._courses: dict[str, _Course] = {}
        self._names: tuple[str, ...] = ()  # the rates among the metrics, found again when they change
        self._metric_count = -1

    def observe_step(self, step: int, metrics: Metrics) -> Sequence[Finding]:
        if len(metrics) != self._metric_count:
            self._metric_count = len(metrics)
            self._names = tuple(name for name in metrics if name == "lr" or name.startswith("lr/"))
        findings = []
        for name in self._names:
            lr = metrics.get(name)
            if lr is None:
                continue
            course = self._courses.setdefault(name, _Course())
            finding = self._follow(name, course, step, lr)
            if finding is not None:
                findings.append(finding)
        return findings

    def _follow(self, name: str, course: _Course, step: int, lr: float) -> Finding | None:
        if not math.isfinite(lr) or lr < 0:
            return None
        if lr > course.peak:
            course.peak, course.peak_step, course.low_since = lr, step, None
            course.history = [(step, lr)]
            return None
        if not course.history or lr <= course.history[-1][1] / 10:
            course.history.append((step, lr))  # a new decade down: worth telling
        if lr == 0 or lr > self.ratio * course.peak:
            course.low_since = None  # back up, or exactly 0 (the invariant's)
            return None
        if course.low_since is None:
            course.low_since = step
        if step - course.low_since < max(self.min_steps, self.share * course.low_since):
            return None
        return self._finding(name, course, step, lr)

    def _finding(self, name: str, course: _Course, step: int, lr: float) -> Finding:
        group = name.partition("/")[2] or "0"
        return Finding(
            "lr_vanished",
            f"the learning rate of param group {group} fell to {fmt(lr)}, {fmt(lr / course.peak)} of its "
            f"peak {fmt(course.peak)} (step {course.peak_step}), and has stayed there since step "
            f"{course.low_since}: updates this small leave float32 weights unchanged while training goes "
            f"on ({where(step, self.rank)})",
            {
                "series": name,
                "lr": lr,
                "peak_lr": course.peak,
                "peak_step": course.peak_step,
                "low_since_step": course.low_since,
                "lr_history": [{"step": s, "lr": v} for s, v in course.history[-12:]],
                "float32_eps": FLOAT32_EPS,
                "step": step,
                "rank": self.rank,
                "likely_causes": [
                    "a scheduler meant to step once an epoch is stepped every batch "
                    "(scheduler.step() inside the batch loop)",
                    "the schedule's length (T_max, total_steps, step_size) is counted in epochs "
                    "where the scheduler is stepped per batch, or the reverse",
                    "a decay factor applied twice (two schedulers on one optimizer, or a manual "
                    "lr *= gamma on top of a scheduler)",
                ],
            },
            key=name,
        )
