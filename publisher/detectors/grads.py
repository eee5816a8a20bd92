"""Detectors that read gradients, weights, updates and layer outputs.

:class:`GradExplosion` reads the step's global gradient norm; the others read the per-layer
samples of :mod:`publisher.stats.sampler` (every few steps, and on every step whose gradient norm
is not finite). Defaults come from SageMaker Debugger's built-in rules (vanishing gradient, weight
update ratio, dead ReLU), AutoTrainer (ICSE 2021) and DeepDiagnosis (ICSE 2022), as each class says.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence

from publisher.detectors.base import Detector, Finding, Metrics, Streak, fmt, name_list, where
from publisher.stats.layer_sample import LayerSample, ParamStat


def _rms(param: ParamStat) -> float | None:
    """Root mean square of a parameter's gradient (its norm per element): comparable across sizes."""
    if param.grad_norm is None or param.numel == 0:
        return None
    return param.grad_norm / math.sqrt(param.numel)


class GradExplosion(Detector):
    """The gradient norm far above its recent level for several observations in a row.

    Baseline as ZClip: exponential moving averages (alpha 0.97) of the mean and variance of the
    norm, after 25 warm-up observations, kept in log space because gradient norms are
    right-skewed. An observation is high when it is ``ratio`` (10) times the baseline AND
    ``z`` (2.5, ZClip's threshold) deviations above it; ``persist`` (3) high observations in a
    row make an explosion (LLM Foundry asks > 4 steps for loss spikes): one bad batch gives a
    one-step spike, which :class:`~publisher.detectors.loss.LossSpike` reports, while a divergence
    keeps growing (BLOOM: 0.24 -> 960). High values stay out of the baseline; after
    ``rebase_after`` (200) high observations in a row the new level is accepted. Non-finite
    norms are ``nonfinite_grad``'s.
    """

    MIN_LOG_SPREAD = 0.05

    def __init__(self, alpha: float = 0.97, warmup: int = 25, ratio: float = 10.0, z: float = 2.5,
                 persist: int = 3, rebase_after: int = 200) -> None:
        self.alpha = alpha
        self.warmup = warmup
        self.ratio = ratio
        self.z = z
        self.persist = persist
        self.rebase_after = rebase_after
        self._seen = 0
        self._mean = 0.0
        self._var = 0.0
        self._high = Streak()
        self._first_high: tuple[int, float] | None = None

    def observe_step(self, step: int, metrics: Metrics) -> Sequence[Finding]:
        norm = metrics.get("grad_norm")
        if norm is None or not math.isfinite(norm) or norm <= 0:
            return ()
        value = math.log(norm)
        if self._seen < self.warmup:
            self._update(value)
            return ()
        baseline = math.exp(self._mean)
        sigmas = (value - self._mean) / max(math.sqrt(self._var), self.MIN_LOG_SPREAD)
        if norm < self.ratio * baseline or sigmas < self.z:
            self._high.update(False)
            self._first_high = None
            self._update(value)
            return ()
        streak = self._high.update(True)
        if self._first_high is None:
            self._first_high = (step, norm)
        if streak >= self.rebase_after:
            self._seen = 0
            self._high.update(False)
        if streak < self.persist:
            return ()
        since_step, since_norm = self._first_high
        return (
            Finding(
                "grad_explosion",
                f"gradient norm {fmt(norm)} at {where(step, self.rank)} is {norm / baseline:.0f}x its recent "
                f"level {fmt(baseline)}, high for {streak} checks since step {since_step}",
                {
                    "grad_norm": norm,
                    "baseline": baseline,
                    "ratio": norm / baseline,
                    "sigmas": sigmas,
                    "high_since_step": since_step,
                    "grad_norm_then": since_norm,
                    "consecutive": streak,
                    "loss": metrics.get("loss"),
                    "lr": metrics.get("lr"),
                    "step": step,
                    "rank": self.rank,
                    "likely_causes": [
                        "learning rate too high for this phase (or a schedule/restart that raised it)",
                        "inputs or targets at a new scale (normalisation lost, a corrupted shard)",
                        "no gradient clipping on a model that needs it (RNNs, deep nets without norms)",
                        "fp16 loss scaling gone wrong, or an unstable op (log/exp/div) amplifying values",
                    ],
                },
            ),
        )

    def _update(self, value: float) -> None:
        self._seen += 1
        if self._seen == 1:
            self._mean, self._var = value, 0.0
            return
        delta = value - self._mean
        self._mean += (1 - self.alpha) * delta
        self._var = self.alpha * (self._var + (1 - self.alpha) * delta * delta)


class NonFiniteGrads(Detector):
    """A gradient holds NaN or Inf while the loss is finite: critical, naming the parameters.

    SageMaker's "exploding tensor" rule, applied per parameter. A non-finite loss makes every
    gradient non-finite; that case is :class:`~publisher.detectors.loss.NonFiniteLoss`'s. With a
    finite loss the fault is in the backward pass itself (sqrt or norm of an exact 0, a custom
    autograd function, an overflow in fp16 gradients).
    """

    reads_partial_samples = True

    quiet_to_close = 5

    def observe_layers(self, step: int, sample: LayerSample, metrics: Metrics) -> Sequence[Finding]:
        loss = metrics.get("loss")
        if loss is not None and not math.isfinite(loss):
            return ()
        bad = sample.nonfinite("grad_norm")
        if not bad:
            return ()
        return (
            Finding(
                "nonfinite_grad",
                f"non-finite gradients in {name_list(bad)} at {where(step, self.rank)} "
                f"while the loss is finite ({fmt(loss)})",
                {
                    "params": bad,
                    "loss": loss,
                    "grad_norm": metrics.get("grad_norm"),
                    "step": step,
                    "rank": self.rank,
                    "likely_causes": [
                        "an op with an infinite derivative at the values seen: sqrt or norm of exactly 0, "
                        "log near 0, acos/asin at +-1",
                        "a custom autograd Function or hook returning NaN/Inf",
                        "fp16 gradients overflowing without a loss scaler (or with a stuck one)",
                    ],
                },
            ),
        )


class NonFiniteParams(Detector):
    """A parameter holds NaN or Inf: critical, naming the parameters.

    SageMaker's "exploding tensor" rule on the weights: once a weight is NaN every later step
    is garbage, whatever the loss of the step that caused it showed.
    """

    quiet_to_close = 5

    def observe_layers(self, step: int, sample: LayerSample, metrics: Metrics) -> Sequence[Finding]:
        bad = sample.nonfinite("param_norm")
        if not bad:
            return ()
        return (
            Finding(
                "nonfinite_param",
                f"non-finite values in the weights of {name_list(bad)} at {where(step, self.rank)}: "
                "training cannot recover from this",
                {
                    "params": bad,
                    "loss": metrics.get("loss"),
                    "lr": metrics.get("lr"),
                    "step": step,
                    "rank": self.rank,
                    "likely_causes": [
                        "an optimizer step taken with non-finite gradients (skip steps whose loss is NaN)",
                        "learning rate so high that the weights overflowed",
                        "a checkpoint loaded with corrupted values, or an in-place write into a parameter",
                    ],
                },
            ),
        )


class VanishingGradient(Detector):
    """Gradients too small to train, confirmed on ``confirm`` (2) samples in a row.

    Two tests on the weight matrices (parameters of 2 or more dimensions) that received a
    non-zero gradient, by root mean square per element so that layers of different sizes compare:
    AutoTrainer's ratio of the first to the last layer below ``min_ratio`` (1e-3: the signal dies
    on its way back), and SageMaker's mean |gradient| below ``min_grad`` (1e-7) over the whole
    model (the mean |g| is at most the RMS used here, so this never fires where SageMaker would
    not). Parameters without a gradient (frozen, sparse rows absent from the batch) and exact
    zeros (a cut graph: ``missing_gradient``'s) take no part.
    """

    quiet_to_close = 3

    def __init__(self, min_ratio: float = 1e-3, min_grad: float = 1e-7, confirm: int = 2) -> None:
        self.min_ratio = min_ratio
        self.min_grad = min_grad
        self.confirm = confirm
        self._streak = Streak()

    def observe_layers(self, step: int, sample: LayerSample, metrics: Metrics) -> Sequence[Finding]:
        weights = [(p, rms) for p in sample.params if len(p.shape) >= 2
                   and (rms := _rms(p)) is not None and math.isfinite(rms) and rms > 0]
        if not weights:
            return ()
        total_sq = math.fsum(p.grad_norm**2 for p, _ in weights if p.grad_norm is not None)
        overall = math.sqrt(total_sq / sum(p.numel for p, _ in weights))
        (first, first_rms), (last, last_rms) = weights[0], weights[-1]
        ratio = first_rms / last_rms if len(weights) > 1 else None
        vanishing = overall < self.min_grad or (ratio is not None and ratio < self.min_ratio)
        if self._streak.update(vanishing) < self.confirm:
            return ()
        why = (f"the first layer's gradients ({first.name}, {fmt(first_rms)} per element) are "
               f"{fmt(ratio)} of the last layer's ({last.name}, {fmt(last_rms)})"
               if ratio is not None and ratio < self.min_ratio
               else f"the gradients average {fmt(overall)} per element (below {fmt(self.min_grad)})")
        return (
            Finding(
                "vanishing_gradient",
                f"vanishing gradients at {where(step, self.rank)}: {why}, "
                f"{self._streak.count} samples in a row",
                {
                    "first_layer": first.name,
                    "last_layer": last.name,
                    "first_rms": first_rms,
                    "last_rms": last_rms,
                    "first_to_last": ratio,
                    "overall_rms": overall,
                    "per_layer_rms": {p.name: rms for p, rms in weights[:32]},
                    "loss": metrics.get("loss"),
                    "step": step,
                    "rank": self.rank,
                    "likely_causes": [
                        "saturating activations (sigmoid/tanh) stacked deep without normalisation",
                        "initialisation too small for the depth (use He/Xavier init)",
                        "no residual connections or normalisation layers in a deep network",
                        "a loss scaled down (or a learning-rate-like factor applied to the loss)",
                    ],
                },
            ),
        )


class UpdateRatio(Detector):
    """Weight update / weight ratio out of range, per weight matrix, from sampled steps.

    Judged on parameters of 2 or more dimensions that got a non-zero gradient with a learning
    rate above 0 (frozen layers, warm-up from 0 and LBFGS's converged steps are left out):

    - too high: ``|dw| / |w| > max_ratio`` (10, SageMaker) on one sample, or a jump: at least
      ``jump`` (10) times the median of that parameter's last ``history`` (5) samples AND above
      ``jump_floor`` (1e-2; the usual rule of thumb for healthy training is about 1e-3, not a
      default of any of those tools): a learning rate suddenly 100x larger shows here at once, while
      a warm restart from a near-zero rate (1e-5 -> 1e-3) stays quiet;
    - too low: above 0 but below ``min_ratio`` (1e-8, SageMaker) on ``confirm`` (2) samples in a
      row while ``lr * |grad| / |w|`` (what plain SGD would have moved) is at least 100x larger:
      the update vanished on its way to the weights (fp16 weights, an epsilon or clipping that
      swallows it). A ratio that is small because the gradients are (convergence) is not
      reported, nor one of exactly 0: a step that changed nothing is ``optimizer_noop``'s (the
      invariants know when that is fine, as for LBFGS at convergence).
    """

    quiet_to_close = 3

    def __init__(self, max_ratio: float = 10.0, min_ratio: float = 1e-8, jump: float = 10.0,
                 jump_floor: float = 1e-2, history: int = 5, confirm: int = 2) -> None:
        self.max_ratio = max_ratio
        self.min_ratio = min_ratio
        self.jump = jump
        self.jump_floor = jump_floor
        self.history = history
        self.confirm = confirm
        self._past: dict[str, deque[float]] = {}
        self._low = Streak()

    def observe_layers(self, step: int, sample: LayerSample, metrics: Metrics) -> Sequence[Finding]:
        if not sample.complete:
            return ()
        high: list[tuple[str, float, float | None]] = []
        low: list[tuple[str, float, float]] = []
        for p in sample.params:
            ratio = p.update_ratio
            if (ratio is None or len(p.shape) < 2 or not p.lr or not p.grad_norm or not p.param_norm
                    or not math.isfinite(ratio)):
                continue
            past = self._past.setdefault(p.name, deque(maxlen=self.history))
            typical = statistics.median(past) if len(past) == past.maxlen else None
            if ratio > self.max_ratio or (
                typical is not None and ratio >= self.jump_floor and ratio >= self.jump * typical
            ):
                high.append((p.name, ratio, typical))
                continue  # an outlier does not enter the history
            past.append(ratio)
            expected = p.lr * p.grad_norm / p.param_norm
            if 0 < ratio < self.min_ratio and expected >= 100 * self.min_ratio:
                low.append((p.name, ratio, expected))
        findings = []
        if high:
            findings.append(self._high(step, high, metrics))
        if self._low.update(bool(low)) >= self.confirm:
            findings.append(self._too_low(step, low, metrics))
        return findings

    def _high(self, step: int, high: list[tuple[str, float, float | None]], metrics: Metrics) -> Finding:
        name, ratio, typical = max(high, key=lambda h: h[1])
        than = (f"{ratio / typical:.0f}x its recent {fmt(typical)}" if typical
                else f"above {fmt(self.max_ratio)}")
        return Finding(
            "update_ratio",
            f"weight updates too large at {where(step, self.rank)}: |dw|/|w| of {name} is {fmt(ratio)}, "
            f"{than}" + (f" ({len(high)} parameters)" if len(high) > 1 else ""),
            {
                "direction": "high",
                "params": {n: {"ratio": r, "typical": t} for n, r, t in high[:32]},
                "max_ratio": self.max_ratio,
                "lr": metrics.get("lr"),
                "grad_norm": metrics.get("grad_norm"),
                "step": step,
                "rank": self.rank,
                "likely_causes": [
                    "the learning rate jumped (a scheduler stepped per batch instead of per epoch, "
                    "a restart, lr scaled by the world size twice)",
                    "a gradient spike from a bad batch without clipping",
                    "weights near zero (a layer re-initialised, strong weight decay): any update is large",
                ],
            },
            key="high",
        )

    def _too_low(self, step: int, low: list[tuple[str, float, float]], metrics: Metrics) -> Finding:
        name, ratio, expected = low[0]
        return Finding(
            "update_ratio",
            f"weight updates vanish at {where(step, self.rank)}: |dw|/|w| of {name} is {fmt(ratio)} where "
            f"lr x gradient would move it by {fmt(expected)}"
            + (f" ({len(low)} parameters)" if len(low) > 1 else ""),
            {
                "direction": "low",
                "params": {n: {"ratio": r, "lr_times_grad": e} for n, r, e in low[:32]},
                "min_ratio": self.min_ratio,
                "lr": metrics.get("lr"),
                "step": step,
                "rank": self.rank,
                "likely_causes": [
                    "weights kept in fp16/bf16: updates below half the weight's precision are rounded away",
                    "an optimizer epsilon, clipping or scaling that swallows the update",
                    "the step updates a copy of the weights, not the ones the model uses",
                ],
            },
            key="low",
        )


def _zero_weight_modules(sample: LayerSample) -> set[str]:
    """Modules whose own parameters (``<module>.<name>``) were all measured and all zero."""
    norms: dict[str, list[float | None]] = {}
    for param in sample.params:
        module, _, own = param.name.rpartition(".")
        if own:
            norms.setdefault(module, []).append(param.param_norm)
    return {module for module, values in norms.items() if all(v == 0.0 for v in values)}


class DeadActivations(Detector):
    """A module whose outputs are (almost) all zero in a training forward.

    Per module output: ``dead_frac``, the share of units zero for every sample of the batch, at
    least ``dead_share`` (0.7: DeepDiagnosis calls a node dead at >= 70 % outputs <= 0;
    SageMaker's dead-ReLU rule flags a layer whose units are never active), judged when each unit
    produced at least ``min_rows`` (8) values (with a batch of 1, half of a healthy ReLU layer is
    "dead"); or ``zero_frac`` at least ``all_zero`` (0.99, SageMaker's all-zero tensor), whatever
    the batch. One sample suffices (``confirm`` 1): a healthy layer does not come near either
    threshold even once, and the next sample is ``StatsConfig.every`` steps away. Modules whose
    zeros are by design (dropout, identity) are not sampled at all, and a module whose own
    weights are all zero is not dead but zero-initialised, waiting for its first updates: the
    last layer of a residual branch (Goyal et al., "Accurate, Large Minibatch SGD", 2017), a
    ControlNet zero convolution, DiT's adaLN-Zero.
    """

    quiet_to_close = 3

    def __init__(self, dead_share: float = 0.7, all_zero: float = 0.99, min_rows: int = 8,
                 confirm: int = 1) -> None:
        self.dead_share = dead_share
        self.all_zero = all_zero
        self.min_rows = min_rows
        self.confirm = confirm
        self._streaks: dict[str, Streak] = {}

    def observe_layers(self, step: int, sample: LayerSample, metrics: Metrics) -> Sequence[Finding]:
        if not sample.complete or not sample.modules:
            return ()
        dead = []
        zero_weights = _zero_weight_modules(sample)
        for module in sample.modules:
            stats = module.values
            is_dead = ((stats["dead_frac"] >= self.dead_share and module.rows >= self.min_rows)
                       or stats["zero_frac"] >= self.all_zero) and module.name not in zero_weights
            streak = self._streaks.setdefault(module.name, Streak())
            if streak.update(is_dead) >= self.confirm:
                dead.append(module)
        if not dead:
            return ()
        worst = max(dead, key=lambda m: (m.values["dead_frac"], m.values["zero_frac"]))
        dead_units, zeros = worst.values["dead_frac"], worst.values["zero_frac"]
        return (
            Finding(
                "dead_activations",
                f"{worst.name} ({worst.type}) outputs zeros: {dead_units:.0%} of its units are zero for the "
                f"whole batch, {zeros:.0%} of all outputs ({where(step, self.rank)})"
                + (f"; also {name_list([m.name for m in dead if m is not worst])}" if len(dead) > 1 else ""),
                {
                    "modules": {m.name: {"type": m.type, "rows": m.rows, **m.values} for m in dead[:32]},
                    "dead_share": self.dead_share,
                    "loss": metrics.get("loss"),
                    "lr": metrics.get("lr"),
                    "step": step,
                    "rank": self.rank,
                    "likely_causes": [
                        "dying ReLUs: a large update pushed pre-activations negative for every input "
                        "(learning rate too high, no warm-up)",
                        "biases initialised (or drifted) strongly negative; inputs not normalised",
                        "a mask or gate that zeroes the layer (wrong padding mask, a gate stuck closed)",
                    ],
                },
            ),
        )


class ClipNoop(Detector):
    """Gradient clipping ran while there was nothing to clip, and the step then used real gradients.

    ``clip_grad_norm_`` / ``clip_grad_value_`` called before ``loss.backward()`` (or right after
    ``zero_grad()``) see gradients that are None or zero: they clip nothing and return 0, the
    optimizer then steps on the full, unclipped gradients, and the explosion clipping was there to
    stop shows up much later as a loss spike. The clip calls are seen by the watch of
    :mod:`publisher.patches.torch_calls`, which reports, per step, how many saw no gradient
    (``clip_noop_calls``); this fires on the first such step whose own gradients were real
    (``grad_norm`` above 0, or not measured on that step), so within one step of the bug.
    """

    quiet_to_close = 20

    def observe_step(self, step: int, metrics: Metrics) -> Sequence[Finding]:
        calls = metrics.get("clip_noop_calls")
        grad_norm = metrics.get("grad_norm")
        if not calls or (grad_norm is not None and not grad_norm > 0):
            return ()
        used = "unclipped gradients" if grad_norm is None else f"unclipped gradients of norm {fmt(grad_norm)}"
        return (
            Finding(
                "clip_noop",
                f"gradient clipping ran {int(calls)} time(s) before step {step} while the gradients were "
                f"None or zero, then the step used {used}: clipping protects nothing "
                f"({where(step, self.rank)})",
                {
                    "clip_calls_without_gradients": int(calls),
                    "grad_norm": grad_norm,
                    "step": step,
                    "rank": self.rank,
                    "likely_causes": [
                        "clip_grad_norm_ / clip_grad_value_ called before loss.backward()",
                        "clipping placed right after optimizer.zero_grad(), before the backward pass",
                        "gradient accumulation: clipping on a micro-step before the last backward",
                    ],
                },
            ),
        )
