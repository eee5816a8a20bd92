"""Detectors that read the loss: non-finite values, spikes, and a loss that never decreases.

Defaults come from public tools, named in each class: SageMaker Debugger's rules, Megatron-LM,
LLM Foundry, Lightning Fabric, OLMo-core, ZClip and AutoTrainer (ICSE 2021).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import operator
import statistics
from collections import deque
from collections.abc import Sequence

from publisher.detectors.base import Detector, Finding, Metrics, fmt, name_list, where
from publisher.stats.layer_sample import LayerSample


class NonFiniteLoss(Detector):
    """Loss is NaN or +/-Inf: critical, from the first occurrence.

    Every public tool treats a non-finite loss as an immediate fault (SageMaker's
    "exploding tensor" rule; AutoTrainer's "loss NaN"; Lightning Fabric counts it as a spike).
    The event says where the numbers went bad: the last finite loss before it, and (from the
    per-layer sample the Monitor takes when the gradient norm is not finite) which parameters
    hold non-finite gradients or values. Non-finite gradients caused by this loss are reported
    here, not as a separate ``nonfinite_grad`` event.
    """

    reads_partial_samples = True

    def __init__(self) -> None:
        self._last_finite: tuple[int, float] | None = None
        self._current: tuple[int, Finding] | None = None

    def observe_step(self, step: int, metrics: Metrics) -> Sequence[Finding]:
        loss = metrics.get("loss")
        if loss is None or math.isfinite(loss):
            if loss is not None:
                self._last_finite = (step, loss)
            return ()
        grad_norm = metrics.get("grad_norm")
        before = self._last_finite
        finding = Finding(
            "nonfinite_loss",
            f"loss is {loss} at {where(step, self.rank)}: this step's gradients are not usable"
            + (f" (last finite loss {fmt(before[1])} at step {before[0]})" if before else ""),
            {
                "value": loss,
                "step": step,
                "rank": self.rank,
                "grad_norm": grad_norm,
                "lr": metrics.get("lr"),
                "last_finite_loss": before[1] if before else None,
                "last_finite_step": before[0] if before else None,
                "likely_causes": [
                    "learning rate too high or warm-up too short (check lr and grad_norm before it)",
                    "fp16 overflow without (or with a stuck) loss scaler",
                    "a batch holding NaN/Inf inputs or labels out of range",
                    "log(0), sqrt of a negative or division by zero in the model or loss",
                ],
            },
        )
        self._current = (step, finding)
        return (finding,)

    def observe_layers(self, step: int, sample: LayerSample, metrics: Metrics) -> Sequence[Finding]:
        current = self._current
        if current is None or current[0] != step:
            return ()
        grads, params = sample.nonfinite("grad_norm"), sample.nonfinite("param_norm")
        if not grads and not params:
            return ()
        finding = current[1]
        where_bad = "; non-finite gradients in " + name_list(grads) if grads else ""
        return (
            dataclasses.replace(
                finding,
                message=finding.message + where_bad,
                details={**finding.details, "nonfinite_grads": grads, "nonfinite_params": params},
            ),
        )


class _LossWindow:
    """The last ``size`` normal losses with O(1) mean and spread, of the loss and of its log.

    Running sums are kept so a step costs a few float operations (this runs for every step).
    They drift with floating-point error, so they are recomputed from the values each
    time the window has been entirely replaced. ``nonpositive`` counts losses <= 0 in the window,
    for which the log statistics do not exist.
    """

    __slots__ = ("_pushes", "log_sum", "log_sumsq", "nonpositive", "size", "sum", "sumsq", "values")

    def __init__(self, size: int) -> None:
        self.size = size
        self.values: deque[float] = deque(maxlen=size)
        self.clear()

    def clear(self) -> None:
        self.values.clear()
        self.sum = self.sumsq = self.log_sum = self.log_sumsq = 0.0
        self.nonpositive = self._pushes = 0

    def push(self, value: float) -> None:
        values = self.values
        if len(values) == self.size:  # the oldest value leaves the sums
            old = values[0]
            self.sum -= old
            self.sumsq -= old * old
            if old > 0:
                log = math.log(old)
                self.log_sum -= log
                self.log_sumsq -= log * log
            else:
                self.nonpositive -= 1
        values.append(value)
        self.sum += value
        self.sumsq += value * value
        if value > 0:
            log = math.log(value)
            self.log_sum += log
            self.log_sumsq += log * log
        else:
            self.nonpositive += 1
        self._pushes += 1
        if self._pushes % self.size == 0:
            self._recompute()

    def _recompute(self) -> None:
        values = self.values
        logs = [math.log(v) for v in values if v > 0]
        self.sum, self.sumsq = math.fsum(values), math.fsum(v * v for v in values)
        self.log_sum, self.log_sumsq = math.fsum(logs), math.fsum(v * v for v in logs)

    @staticmethod
    def spread(total: float, total_sq: float, n: int) -> tuple[float, float]:
        """Mean and standard deviation from running sums."""
        mean = total / n
        return mean, math.sqrt(max(0.0, total_sq / n - mean * mean))


class LossSpike(Detector):
    """Loss far above its recent level, judged against the last ``window`` normal steps.

    A step is a spike when BOTH hold (each alone has false alarms):
    - ``loss >= ratio * mean`` (for a negative mean: ``loss - mean >= (ratio - 1) * |mean|``):
      ratio 2.0, as LLM Foundry (loss >= 2x the mean of a 100-step window) and Lightning Fabric
      (rtol 2.0). Alone, it fires on small noisy losses.
    - the loss is ``z`` = 6 standard deviations above the window, as OLMo-core (mean + 6 sigma
      over 128 steps). Alone, it fires on very flat curves where sigma is tiny. Unlike OLMo-core,
      sigma is measured on log(loss) while losses are positive: per-batch losses are right-skewed
      (a few hard batches), so a small-batch run with heavy-tailed noise gets a wide spread and
      stays quiet, while on a steady large-batch run a real spike still stands out by dozens of
      sigmas. Non-positive losses (ELBOs, log-likelihoods) are measured linearly.
    ``window`` 100 follows LLM Foundry; no check before ``warmup`` (25, ZClip's warm-up) normal
    steps, since the first steps fall fast and have no baseline. During normal descent the
    window's mean lies above the current loss, which only makes the test stricter.

    Unlike LLM Foundry (> 4 steps in a row) one step suffices: a corrupted batch is worth seeing,
    and the episode tracker folds a sustained spike into one event. Spike values stay out of the
    baseline so a divergence keeps being reported; after ``rebase_after`` spike steps in a row the
    high level is accepted as the new normal (a data-phase change) and the baseline restarts.
    """

    #: Smallest spread assumed: 0.1 % of the loss (a perfectly flat curve has none at all).
    MIN_RELATIVE_SPREAD = 1e-3

    def __init__(
        self,
        window: int = 100,
        ratio: float = 2.0,
        z: float = 6.0,
        warmup: int = 25,
        rebase_after: int = 200,
    ) -> None:
        if window < 2 or warmup < 2 or warmup > window:
            raise ValueError("LossSpike needs 2 <= warmup <= window")
        self.ratio = ratio
        self.z = z
        self.warmup = warmup
        self.rebase_after = rebase_after
        self._window = _LossWindow(window)
        self._spike_run = 0

    def observe_step(self, step: int, metrics: Metrics) -> Sequence[Finding]:
        loss = metrics.get("loss")
        if loss is None or not math.isfinite(loss):
            return ()
        window = self._window
        n = len(window.values)
        if n < self.warmup:
            window.push(loss)
            return ()
        mean, std = window.spread(window.sum, window.sumsq, n)
        in_log_space = window.nonpositive == 0 and loss > 0
        if in_log_space:
            log_mean, log_std = window.spread(window.log_sum, window.log_sumsq, n)
            spread = max(log_std, self.MIN_RELATIVE_SPREAD)
            sigmas = (math.log(loss) - log_mean) / spread
        else:
            spread = max(std, self.MIN_RELATIVE_SPREAD * abs(mean), 1e-12)
            sigmas = (loss - mean) / spread
        if loss - mean < (self.ratio - 1.0) * abs(mean) or sigmas < self.z:
            self._spike_run = 0
            window.push(loss)
            return ()
        self._spike_run += 1
        if self._spike_run >= self.rebase_after:
            window.clear()
            self._spike_run = 0
        ratio = loss / mean if mean > 0 else None
        times = f"{ratio:.1f}x" if ratio is not None else f"+{fmt(loss - mean)} over"
        return (
            Finding(
                "loss_spike",
                f"loss {fmt(loss)} at {where(step, self.rank)} is {times} its recent mean {fmt(mean)} "
                f"(+{sigmas:.0f} sigma over the last {n} steps)",
                {
                    "value": loss,
                    "baseline": mean,
                    "ratio": ratio,
                    "sigmas": sigmas,
                    "spread": spread,
                    "spread_of": "log(loss)" if in_log_space else "loss",
                    "window": n,
                    "step": step,
                    "rank": self.rank,
                    "grad_norm": metrics.get("grad_norm"),
                    "lr": metrics.get("lr"),
                    "likely_causes": [
                        "a bad or corrupted batch (look at the data of this step)",
                        "learning rate too high for this phase (check lr and the schedule)",
                        "optimizer instability (Adam epsilon/beta2 too small, no grad clipping)",
                        "numerics: fp16/bf16 overflow, a loss scaler that just changed",
                    ],
                },
            ),
        )


def chance_classes(loss: float, tolerance: float = 0.01, most: int = 1000) -> int | None:
    """The class count ``k`` whose chance-level cross-entropy ``log(k)`` is within ``tolerance``
    (relative) of ``loss``, if any: a model predicting a constant sits there."""
    if not 0.5 < loss < math.log(most + 1):
        return None
    k = max(2, round(math.exp(loss)))
    return k if abs(loss - math.log(k)) <= tolerance * math.log(k) else None


class LossPlateau(Detector):
    """The loss is not decreasing: the run has not learned anything since it settled.

    After ``settle`` (10) steps, the mean of the next ``window`` (30) losses is the reference; a
    mean of the last ``window`` ``min_progress`` (2 %) below it means learning, and the detector
    stops for good. Otherwise, ``patience`` (90) steps after the reference and every 10 steps
    from then on, a least-squares line through the last ``window + patience`` losses that does
    not slope down significantly (t-statistic not below ``-t``, 2) is a plateau, reported as a
    warning that says when the loss sits at ``log(k)``, chance for k classes. Steps at lr 0 or
    with a rising lr (warm-up) do not count; with more than one optimizer (a GAN) it stays quiet.
    Why a trend over 120 steps, and not SageMaker's LossNotDecreasing rule: docs/detectors.md,
    "``loss_plateau``".
    """

    quiet_to_close = 50

    def __init__(self, settle: int = 10, window: int = 30, patience: int = 90, min_progress: float = 0.02,
                 t: float = 2.0) -> None:
        if settle < 0 or window < 2 or patience < 1 or not 0 < min_progress < 1:
            raise ValueError("LossPlateau: settle >= 0, window >= 2, patience >= 1, 0 < min_progress < 1")
        self.settle = settle
        self.window = window
        self.patience = patience
        self.min_progress = min_progress
        self.t = t
        self._counted = 0
        self._lr: float | None = None
        self._reference: float | None = None
        self._losses: deque[float] = deque(maxlen=window + patience)
        self._learning = False

    def observe_step(self, step: int, metrics: Metrics) -> Sequence[Finding]:
        loss = metrics.get("loss")
        if self._learning or loss is None or not math.isfinite(loss) or self.context.optimizers > 1:
            return ()
        lr, previous = metrics.get("lr"), self._lr
        self._lr = lr
        if lr is not None and (lr <= 0 or (previous is not None and lr > previous * (1 + 1e-9))):
            return ()  # warm-up or a zero learning rate: no progress is expected
        self._counted += 1
        if self._counted <= self.settle:
            return ()
        losses = self._losses
        losses.append(loss)
        seen = self._counted - self.settle
        if seen < self.window or (seen > self.window and seen % 10):
            return ()
        recent = statistics.fmean(itertools.islice(losses, len(losses) - self.window, None))
        reference = self._reference
        if reference is None:
            self._reference = recent
            return ()
        if recent <= reference - self.min_progress * abs(reference):
            self._learning = True
            return ()
        if seen < self.window + self.patience or abs(reference) < 1e-12:
            return ()
        slope, t = _trend(losses)
        if t < -self.t:
            return ()  # slow, but still going down
        classes = chance_classes(recent)
        chance = f"; it equals log({classes}): chance level for {classes} classes" if classes else ""
        return (
            Finding(
                "loss_plateau",
                f"loss is not decreasing: mean {fmt(recent)} over the last {self.window} steps vs "
                f"{fmt(reference)} {seen - self.window} steps earlier, no downward trend "
                f"({where(step, self.rank)}){chance}",
                {
                    "mean_loss": recent,
                    "reference_loss": reference,
                    "change": (recent - reference) / abs(reference),
                    "min_progress": self.min_progress,
                    "slope_per_step": slope,
                    "slope_t": t,
                    "steps_without_progress": seen - self.window,
                    "window": self.window,
                    "chance_level_classes": classes,
                    "lr": lr,
                    "step": step,
                    "rank": self.rank,
                    "likely_causes": [
                        "labels do not match the inputs (shuffled or joined separately): chance-level loss",
                        "learning rate far too small, or the optimizer does not hold the model's parameters",
                        "gradients never reach the weights (detached tensors, frozen layers, vanishing)",
                        "inputs carry no signal (all equal, wrong column, normalised to zero)",
                    ],
                },
            ),
        )


#: However noisy the loss, a mean more than this share below the label entropy is not chance.
_WIDEST_BAND = 0.1


class ChanceLoss(Detector):
    """A classification loss that sits at chance level while the gradients flow: nothing is learned.

    A classifier that learned nothing about its inputs predicts the label prior: its cross-entropy
    is the labels' entropy H (``log C`` for C balanced classes). Karpathy's "A Recipe for Training
    Neural Networks" (2019) makes the check by hand: the loss at initialisation is ``log C``, and
    it must then leave it. The ``cross_entropy`` watch (:mod:`publisher.patches.torch_calls`)
    gives C and H. Fires when, over the last ``window`` (48) steps after ``settle`` (10), the mean
    loss (clipped at ``FENCE``) is in the band from H less ``z`` (2.5) standard errors (or
    ``margin``, 0.5 %, of H; 10 % at most) to ``log C`` plus ``tolerance`` (2 %), its trend
    carried ``horizon`` (3) windows ahead stays in it, and the gradients flow; judged when the
    window first fills, then every :attr:`JUDGE_EVERY` steps. Steps at lr 0 or
    warming up do not count, nor runs with more than one optimizer. Why each part, and what it
    was measured on: docs/detectors.md, "``chance_loss``".
    """

    quiet_to_close = 50
    #: Losses further than this many robust standard deviations from the window's median count as
    #: the fence (one corrupted batch of loss 70 among losses of 0.5 would otherwise lift the
    #: window's mean into the chance band for 48 steps).
    FENCE = 5.0
    #: Steps between two judgements once the window is full: the verdict is about the last 48 steps,
    #: and judging it costs ~50 us of Python (two sorts, a clip, a line fit) on the step worker,
    #: more than the other step detectors together; an episode stays open across the gaps
    #: (``quiet_to_close``), and a run that falls to chance is named at most 3 steps later.
    JUDGE_EVERY = 4

    def __init__(self, settle: int = 10, window: int = 48, horizon: float = 3.0, z: float = 2.5,
                 margin: float = 0.005, tolerance: float = 0.02) -> None:
        if settle < 0 or window < 3 or horizon < 0 or z < 0 or not 0 <= margin < 1 or not 0 <= tolerance < 1:
            raise ValueError("ChanceLoss: settle >= 0, window >= 3, horizon >= 0, z >= 0, margin and "
                             "tolerance in [0, 1)")
        self.settle = settle
        self.window = window
        self.horizon = horizon
        self.z = z
        self.margin = margin
        self.tolerance = tolerance
        self._counted = 0
        self._lr: float | None = None
        self._losses: deque[float] = deque(maxlen=window)

    def observe_step(self, step: int, metrics: Metrics) -> Sequence[Finding]:
        context = self.context
        loss = metrics.get("loss")
        if context.classes is None or context.optimizers > 1 or loss is None or not math.isfinite(loss):
            return ()
        lr, previous = metrics.get("lr"), self._lr
        self._lr = lr
        if lr is not None and (lr <= 0 or (previous is not None and lr > previous * (1 + 1e-9))):
            return ()  # warm-up or a zero learning rate: no progress is expected yet
        self._counted += 1
        if self._counted <= self.settle:
            return ()
        self._losses.append(loss)
        grad_norm = metrics.get("grad_norm")
        if len(self._losses) < self.window or (grad_norm is not None and not grad_norm > 0):
            return ()
        if (self._counted - self.settle - self.window) % self.JUDGE_EVERY:
            return ()  # judged from the first full window on, then every few steps (sorts and fits)
        log_c = math.log(context.classes)
        prior = context.label_entropy or log_c
        low, high = prior * (1 - _WIDEST_BAND), log_c * (1 + self.tolerance)
        # The clipped mean lies between the window's extremes (every value is clipped towards the
        # median): a window wholly outside the band is far from chance without sorting it, the
        # usual case once a run learns (the sorts cost ~20x these two scans).
        if max(self._losses) < low or min(self._losses) > high:
            return ()
        losses = _winsorized(self._losses, self.FENCE)
        mean = statistics.fmean(losses)
        if not low <= mean <= high:
            return ()  # far from chance: no line to fit
        slope, spread = _fit(losses)
        below = max(self.z * spread / math.sqrt(self.window), self.margin * prior)
        floor = prior - min(below, _WIDEST_BAND * prior)
        projected = mean + slope * self.horizon * self.window
        if mean < floor or projected < floor:
            return ()
        prior_name = "the labels' entropy" if context.label_entropy else "log(C), labels not counted"
        return (
            Finding(
                "chance_loss",
                f"the loss sits at chance level: mean {fmt(mean)} over the last {self.window} steps, "
                f"chance is {fmt(prior)} ({prior_name}) to {fmt(log_c)} (log C) for {context.classes} "
                f"classes, and its trend stays there; the gradients flow ({where(step, self.rank)})",
                {
                    "mean_loss": mean,
                    "chance_level": prior,
                    "chance_from": prior_name,
                    "classes": context.classes,
                    "log_classes": log_c,
                    "label_entropy": context.label_entropy,
                    "slope_per_step": slope,
                    "projected_loss": projected,
                    "floor": floor,
                    "window": self.window,
                    "grad_norm": grad_norm,
                    "lr": lr,
                    "step": step,
                    "rank": self.rank,
                    "likely_causes": [
                        "labels do not match the inputs (shuffled with a different permutation, "
                        "misaligned after filtering or joining)",
                        "inputs carry no signal (all equal, the wrong column, normalised to zero)",
                        "the learning rate is far too small, or the optimizer holds other parameters",
                        "the loss target is wrong (class ids vs one-hot, ignore_index, label smoothing 1.0)",
                    ],
                },
            ),
        )


def _winsorized(values: Sequence[float], fence: float) -> list[float]:
    """``values`` clipped to their median +/- ``fence`` robust standard deviations (1.4826 x the
    median absolute deviation, the normal-consistent scale of Rousseeuw & Croux, JASA 1993), so one
    outlier moves a mean or a least-squares line by no more than an ordinary value would."""
    ordered = sorted(values)
    median = _median_of_sorted(ordered)
    scale = 1.4826 * _median_of_sorted(sorted([abs(v - median) for v in ordered]))
    low, high = median - fence * scale, median + fence * scale
    if low <= ordered[0] and ordered[-1] <= high:
        return list(values)  # nothing beyond the fences: the usual window
    return [low if v < low else high if v > high else v for v in values]


def _median_of_sorted(ordered: Sequence[float]) -> float:
    """:func:`statistics.median` of values already sorted (it would sort them again)."""
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _fit(values: Sequence[float]) -> tuple[float, float]:
    """Least-squares slope of ``values`` against their index, and the residuals' standard deviation
    (the residual sum of squares is the spread less what the line explains; the sums run in C,
    ``map`` over ``operator.mul``, not in a Python generator)."""
    n = len(values)
    y_mean = math.fsum(values) / n
    sxx = n * (n * n - 1) / 12
    slope = math.fsum(map(operator.mul, _centred_indices(n), values)) / sxx
    deviations = [y - y_mean for y in values]
    residual = math.fsum(map(operator.mul, deviations, deviations)) - slope * slope * sxx
    return slope, math.sqrt(max(residual, 0.0) / (n - 2)) if n > 2 else 0.0


@functools.lru_cache(maxsize=8)
def _centred_indices(n: int) -> tuple[float, ...]:
    """0 .. n-1 less their mean: the x of every window of ``n`` losses (a few window sizes a run)."""
    return tuple(i - (n - 1) / 2 for i in range(n))


def _trend(values: Sequence[float]) -> tuple[float, float]:
    """Least-squares slope of ``values`` against their index, and its t-statistic."""
    slope, spread = _fit(values)
    error = spread / math.sqrt(len(values) * (len(values) ** 2 - 1) / 12)
    if error == 0:
        return slope, -math.inf if slope < 0 else (math.inf if slope > 0 else 0.0)
    return slope, slope / error
