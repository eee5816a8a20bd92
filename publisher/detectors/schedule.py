"""Learning that stops because the updates do: a rate that decayed away, or one below the weights'
float resolution, while training goes on.

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

A rate can also be too small from the start (``lr=1e-9`` typed for ``1e-1``, a rate scaled down
twice): it never falls from a peak, and the updates are below the weights' resolution all along.
Per-layer samples measure what the step did (``|dw| / |w|`` from elements copied around
``optimizer.step()``), so a sample in which most trained parameters did not move (a ratio under
float32's eps: at most a few elements moved by one unit in the last place) while their gradients
flow (at least 1e-3 of their largest gradient norm so far: converged training has gradients a
million times smaller before its updates drop below resolution; and at least eps of the weight, so
that a rate of 1 would move it: gradients smaller than that have vanished, the
``vanishing_gradient`` detector's, and no rate is to blame) and ``lr * |g| / |w|`` is itself
under resolution (else the update was lost on its way, fp16 weights: ``update_ratio``'s) names it
too, on ``confirm`` (3) samples in a row spanning at least ``confirm_steps`` (10) steps. A rate
that rose since the previous sample (warm-up) restarts the count, and one under a tenth of its
peak is the decay above.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from publisher.detectors.base import Detector, Finding, Metrics, fmt, name_list, where
from publisher.stats.layer_sample import LayerSample, ParamStat

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

    def __init__(self, ratio: float = 1e-4, share: float = 0.03, min_steps: int = 50, confirm: int = 3,
                 confirm_steps: int = 10) -> None:
        self.ratio = ratio
        self.share = share
        self.min_steps = min_steps
        self.confirm = confirm
        self.confirm_steps = confirm_steps
        self._grad_peaks: dict[str, float] = {}  # each parameter's largest gradient norm sampled
        self._lr_peaks: dict[str, float] = {}  # each parameter's largest rate sampled
        self._stuck_since: int | None = None  # the first sample of the current stretch that did not move
        self._stuck_samples = 0
        #: The finding of a confirmed stretch, repeated on the steps between samples (the episode
        #: lasts until a sample sees the weights move, not until the next unsampled step).
        self._unmoved_finding: Finding | None = None
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
            course = self._courses.get(name)
            if course is None:  # not setdefault: that would build a course on every step
                course = self._courses[name] = _Course()
            finding = self._follow(name, course, step, lr)
            if finding is not None:
                findings.append(finding)
        if self._unmoved_finding is not None:
            findings.append(self._unmoved_finding)
        return findings

    def observe_layers(self, step: int, sample: LayerSample, metrics: Metrics) -> Sequence[Finding]:
        """The updates a sample measured: most parameters not moved at a rate at its peak."""
        judged: list[ParamStat] = []
        stuck: list[ParamStat] = []
        rose = False
        for p in sample.params:
            lr, grad, size, ratio = p.lr, p.grad_norm, p.param_norm, p.update_ratio
            if not lr or lr < 0 or not grad or not size or ratio is None or not math.isfinite(ratio + grad):
                continue
            lr_peak = self._lr_peaks.get(p.name, 0.0)
            rose = rose or (lr_peak > 0 and lr > lr_peak * (1 + 1e-9))
            self._lr_peaks[p.name] = lr_peak = max(lr_peak, lr)
            grad_peak = self._grad_peaks[p.name] = max(self._grad_peaks.get(p.name, 0.0), grad)
            judged.append(p)
            if (ratio < FLOAT32_EPS and grad >= 1e-3 * grad_peak and grad >= FLOAT32_EPS * size
                    and lr >= 0.1 * lr_peak and lr * grad / size < 100 * FLOAT32_EPS):
                stuck.append(p)
        if rose or not judged or 2 * len(stuck) < len(judged):
            self._stuck_since, self._stuck_samples, self._unmoved_finding = None, 0, None
            return ()
        if self._stuck_since is None:
            self._stuck_since = step
        self._stuck_samples += 1
        if self._stuck_samples < self.confirm or step - self._stuck_since < self.confirm_steps:
            return ()
        self._unmoved_finding = self._unmoved(step, stuck, len(judged))
        return (self._unmoved_finding,)

    def _unmoved(self, step: int, stuck: list[ParamStat], judged: int) -> Finding:
        lrs = sorted({p.lr for p in stuck if p.lr})
        moves = [(p.lr or 0.0) * (p.grad_norm or 0.0) / (p.param_norm or 1.0) for p in stuck]
        return Finding(
            "lr_vanished",
            f"the updates leave the weights unchanged: {len(stuck)} of {judged} trained parameters did not "
            f"move on {self._stuck_samples} samples since step {self._stuck_since} while their gradients "
            f"flow; at lr {fmt(lrs[0])}{'' if len(lrs) == 1 else f' to {fmt(lrs[-1])}'} an update is "
            f"about {fmt(max(moves))} of a weight, below float32's resolution ({fmt(FLOAT32_EPS)}): the "
            f"learning rate is too small for these weights ({name_list([p.name for p in stuck])}, "
            f"{where(step, self.rank)})",
            {
                "cause": "below_resolution",
                "params": {p.name: {"lr": p.lr, "grad_norm": p.grad_norm, "param_norm": p.param_norm,
                                    "update_ratio": p.update_ratio, "lr_times_grad": m}
                           for p, m in list(zip(stuck, moves, strict=True))[:32]},
                "unmoved": len(stuck),
                "judged": judged,
                "samples": self._stuck_samples,
                "since_step": self._stuck_since,
                "lr": lrs[0],
                "float32_eps": FLOAT32_EPS,
                "step": step,
                "rank": self.rank,
                "likely_causes": [
                    "a learning rate typed or scaled wrong (1e-9 for 1e-1; divided by the world size or "
                    "the accumulation steps twice)",
                    "a rate meant for a loss summed over the batch used with a mean loss (or the reverse)",
                    "a schedule that starts from a tiny rate and never rises (warm-up length in the wrong "
                    "unit)",
                ],
            },
            key="below_resolution",
        )

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
