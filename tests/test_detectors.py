"""Detectors and episodes: what a user sees in the event log for healthy runs and for real faults."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable
from typing import Any

import psutil
import pytest

from publisher.detectors import Detector, DetectorSet, Finding, default_detectors
from publisher.detectors.base import TrainingContext, overrides
from publisher.detectors.episodes import EpisodeTracker
from publisher.detectors.gpu import GpuEcc, GpuImbalance, GpuLowUtil, GpuThrottle
from publisher.detectors.grads import (
    DeadActivations,
    GradExplosion,
    NonFiniteGrads,
    NonFiniteParams,
    UpdateRatio,
    VanishingGradient,
)
from publisher.detectors.loss import ChanceLoss, LossPlateau, LossSpike, NonFiniteLoss
from publisher.detectors.published import ON_PUBLISHED_METRICS, split_defaults
from publisher.detectors.schedule import LrVanished
from publisher.detectors.speed import DataBottleneck, MemoryGrowth, StepTimeOutlier, ThroughputDrop
from publisher.stats.layer_sample import ACTIVATION_FIELDS, LayerSample, ModuleStat, ParamStat
from publisher.telemetry_errors import OFF_AFTER
from publisher.threads.gpu import SimulatedSource
from publisher.wire.event_kinds import EVENT_KINDS

Event = tuple[int | None, dict[str, Any]]


def collector() -> tuple[list[Event], Any]:
    events: list[Event] = []
    return events, lambda step, body: events.append((step, body))


def run_losses(detector: Detector, losses: Iterable[float]) -> list[tuple[int, Finding]]:
    found = []
    for step, loss in enumerate(losses, start=1):
        found.extend((step, f) for f in detector.observe_step(step, {"loss": loss}))
    return found


def noisy_descent(seed: int, steps: int = 3000, noise: float = 0.15) -> list[float]:
    """A realistic healthy curve: fast early descent, slow tail, multiplicative batch noise."""
    rng = random.Random(seed)
    return [(0.4 + 2.0 * math.exp(-s / 300)) * math.exp(rng.gauss(0.0, noise)) for s in range(steps)]


# -- episodes ------------------------------------------------------------------------------------


def test_repeated_finding_is_one_event_whose_count_grows_then_ends_after_quiet_steps() -> None:
    events, emit = collector()
    tracker = EpisodeTracker(emit, rank=3, min_update_s=60.0)
    owner = object()
    nan = Finding("nonfinite_loss", "loss is nan", {"value": math.nan})
    for step in range(10, 16):
        tracker.observe(owner, step, [nan], quiet_to_close=4)
    assert len(events) == 1, "repeats inside the rate limit must not each make an event"
    step, first = events[0]
    assert (step, first["id"], first["count"], first["severity"]) == (10, "3-0", 1, "critical")
    assert first["details"]["value"] == "nan"  # JSON-safe on the way out

    for step in range(16, 19):
        tracker.observe(owner, step, [], quiet_to_close=4)
    assert len(events) == 1, "the episode is still open after 3 quiet steps"
    tracker.observe(owner, 19, [], quiet_to_close=4)
    assert len(events) == 2, "closing the episode sends the count held back by the rate limit"
    step, final = events[1]
    assert (step, final["id"], final["count"]) == (10, "3-0", 6)
    assert (final["details"]["first_step"], final["details"]["last_step"]) == (10, 15)

    tracker.observe(owner, 40, [nan], quiet_to_close=4)
    assert events[2][1]["id"] == "3-1" and events[2][1]["count"] == 1, "a new episode has a new id"


def test_an_update_keeps_what_set_the_episode_off_and_carries_the_latest_repeat_beside_it() -> None:
    """An ``inf`` loss (a ``log(0)``) followed by ``nan``s: the event still says ``inf``."""
    events, emit = collector()
    tracker = EpisodeTracker(emit, min_update_s=60.0)
    owner = object()
    inf = Finding("nonfinite_loss", "loss is inf at step 843", {"value": math.inf})
    tracker.observe(owner, 843, [inf], quiet_to_close=5)
    for step in range(844, 1501):
        tracker.observe(owner, step, [Finding("nonfinite_loss", f"loss is nan at step {step}",
                                              {"value": math.nan})], quiet_to_close=5)
    tracker.flush()
    (_, first), (step, update) = events
    assert "latest" not in first
    assert (step, update["count"], update["message"], update["details"]["value"]) == (
        843, 658, "loss is inf at step 843", "inf")
    assert update["latest"] == {"step": 1500, "message": "loss is nan at step 1500", "value": "nan",
                                "details": {"value": "nan"}}, "the details that changed since it fired"
    assert (update["details"]["first_step"], update["details"]["last_step"]) == (843, 1500)


def test_updates_are_rate_limited_not_per_step() -> None:
    events, emit = collector()
    tracker = EpisodeTracker(emit, min_update_s=0.05)
    owner = object()
    spike = Finding("loss_spike", "spike")
    started = time.monotonic()
    step = 0
    while time.monotonic() - started < 0.3:
        step += 1
        tracker.observe(owner, step, [spike], quiet_to_close=5)
        time.sleep(0.001)
    counts = [body["count"] for _, body in events]
    assert len({body["id"] for _, body in events}) == 1
    assert counts == sorted(counts) and counts[0] == 1
    assert 2 <= len(events) <= 8 < step, f"{len(events)} events for {step} repeats"


def test_escalation_is_sent_at_once_and_keys_separate_episodes() -> None:
    events, emit = collector()
    tracker = EpisodeTracker(emit, min_update_s=60.0)
    owner = object()
    tracker.observe(owner, 1, [Finding("gpu_throttle", "gpu 1", key=1)], quiet_to_close=5)
    tracker.observe(owner, 2, [Finding("gpu_throttle", "gpu 1", key=1, severity="critical")], 5)
    tracker.observe(owner, 3, [Finding("gpu_throttle", "gpu 2", key=2)], quiet_to_close=5)
    assert [(b["id"], b["severity"], b["count"]) for _, b in events] == [
        ("0-0", "warning", 1),
        ("0-0", "critical", 2),
        ("0-1", "warning", 1),
    ]


def test_flush_sends_held_back_counts() -> None:
    events, emit = collector()
    tracker = EpisodeTracker(emit, min_update_s=60.0)
    owner = object()
    for step in range(5):
        tracker.observe(owner, step, [Finding("loss_spike", "spike")], quiet_to_close=50)
    tracker.flush()
    assert [b["count"] for _, b in events] == [1, 5]
    tracker.flush()
    assert len(events) == 2, "nothing new to say"


def test_a_broken_detector_costs_its_own_observations_is_told_once_and_switched_off() -> None:
    class Broken(Detector):
        calls = 0

        def observe_step(self, step: int, metrics: Any) -> Iterable[Finding]:
            Broken.calls += 1
            raise ZeroDivisionError("bug in a detector")

    events, emit = collector()
    detectors = DetectorSet([Broken(), NonFiniteLoss()], emit)
    for step in range(1, OFF_AFTER + 11):
        detectors.observe_step(step, {"loss": math.nan})
    told = [(b["kind"], b["severity"], step) for step, b in events if b["kind"] != "nonfinite_loss"]
    assert told == [("telemetry_error", "info", 1), ("telemetry_error", "warning", OFF_AFTER)]
    assert Broken.calls == OFF_AFTER, "switched off: not called again"
    assert [b["kind"] for _, b in events].count("nonfinite_loss") == 1  # the others went on
    first = next(b for _, b in events if b["kind"] == "telemetry_error")
    assert first["details"]["part"] == "detector Broken"
    assert first["details"]["error"] == "ZeroDivisionError: bug in a detector"


def test_default_detectors_emit_only_canonical_kinds_and_attribute_rank() -> None:
    events, emit = collector()
    detectors = DetectorSet(default_detectors(), emit, rank=5)
    source = SimulatedSource()
    source.starve(2)
    source.throttle(1, "sw_thermal")
    source.add_ecc_errors(0, 2)
    for step in range(1, 40):
        detectors.observe_step(step, {"loss": 1.0 if step != 30 else 50.0})
        detectors.observe_gpu(step, source.read())
    detectors.observe_step(40, {"loss": math.inf})
    kinds = {body["kind"] for _, body in events}
    assert kinds == {"loss_spike", "gpu_imbalance", "gpu_throttle", "gpu_ecc", "nonfinite_loss"}
    assert kinds <= set(EVENT_KINDS)
    assert all(body["id"].startswith("5-") and body["details"]["rank"] == 5 for _, body in events)
    assert all("rank 5" in body["message"] for _, body in events)


# -- loss detectors ------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nonfinite_loss_is_critical_and_says_where(value: float) -> None:
    detector = NonFiniteLoss()
    detector.rank = 2
    (finding,) = detector.observe_step(812, {"loss": value, "grad_norm": math.nan, "lr": 0.1})
    assert finding.kind == "nonfinite_loss" and finding.resolved_severity() == "critical"
    assert "step 812" in finding.message and "rank 2" in finding.message
    assert finding.details["lr"] == 0.1 and finding.details["likely_causes"]
    assert not list(detector.observe_step(813, {"loss": 0.5}))


@pytest.mark.parametrize("seed", range(6))
def test_loss_spike_stays_quiet_on_healthy_noisy_descent(seed: int) -> None:
    assert run_losses(LossSpike(), noisy_descent(seed)) == []


def test_loss_spike_needs_both_the_ratio_and_the_sigma_test() -> None:
    rng = random.Random(0)
    # A small loss with +-30 % batch noise: "2x the mean" alone fires again and again.
    small_noisy = [0.02 * math.exp(rng.gauss(0.0, 0.3)) for _ in range(2000)]
    assert len(run_losses(LossSpike(z=0.0), small_noisy)) >= 10
    assert len(run_losses(LossSpike(), small_noisy)) <= 1
    # A very flat curve: a 2 % wiggle is many sigmas, but not a spike.
    flat = [1.0 + rng.gauss(0.0, 1e-4) for _ in range(300)]
    flat[250] = 1.02
    assert len(run_losses(LossSpike(ratio=1.0), flat)) == 1
    assert run_losses(LossSpike(), flat) == []


def test_loss_spike_stays_quiet_during_warmup() -> None:
    # The first steps of a run jump around wildly; there is no baseline to compare them with.
    wild_start = [2.3, 9.0, 1.5, 14.0, 0.9] + [1.0] * 19
    assert run_losses(LossSpike(), wild_start) == []


def test_loss_spike_fires_on_a_corrupted_batch_with_the_numbers() -> None:
    losses = noisy_descent(seed=1, steps=600)
    losses[500] = 6.0 * losses[499]
    found = run_losses(LossSpike(), losses)
    assert [step for step, _ in found] == [501]
    finding = found[0][1]
    assert finding.kind == "loss_spike" and finding.resolved_severity() == "warning"
    details = finding.details
    assert details["value"] == losses[500] and details["ratio"] > 4 and details["sigmas"] > 6
    assert details["baseline"] == pytest.approx(sum(losses[400:500]) / 100)
    assert "step 501" in finding.message and "x its recent mean" in finding.message


def test_loss_spike_keeps_reporting_a_divergence_then_accepts_a_new_level() -> None:
    losses = [1.0 + 0.01 * (i % 3) for i in range(100)] + [5.0] * 300
    found = run_losses(LossSpike(rebase_after=50), losses)
    steps = [step for step, _ in found]
    assert steps[:50] == list(range(101, 151)), "a sustained high loss is reported every step"
    assert len(steps) == 50, "after rebase_after spike steps the high level is the new normal"


def test_loss_spike_works_for_negative_losses() -> None:
    rng = random.Random(0)
    losses = [-3.0 + rng.gauss(0, 0.02) for _ in range(200)]
    losses[150] = 1.0
    assert [step for step, _ in run_losses(LossSpike(), losses)] == [151]


# -- GPU detectors -------------------------------------------------------------------------------


def gpu(index: int, util: float = 95.0, **fields: Any) -> dict[str, Any]:
    return {"index": index, "util": util, "throttle": [], "ecc_errors": 0, **fields}


def test_gpu_imbalance_needs_busy_peers_and_a_full_window() -> None:
    detector = GpuImbalance(window=5)
    lagging = [gpu(0), gpu(1), gpu(2, util=20.0), gpu(3)]
    results = [list(detector.observe_gpu(s, lagging)) for s in range(5)]
    assert results[:4] == [[]] * 4, "no verdict before the window is full"
    (finding,) = results[4]
    assert finding.key == 2 and finding.details["util"] == 20.0 and finding.details["median_others"] == 95.0
    idle = GpuImbalance(window=2)
    everyone_idle = [gpu(0, 10.0), gpu(1, 12.0), gpu(2, 0.0)]
    assert [list(idle.observe_gpu(s, everyone_idle)) for s in range(3)] == [[]] * 3


def test_gpu_throttle_needs_two_samples_and_ignores_the_power_cap() -> None:
    detector = GpuThrottle()
    hot = [gpu(0, throttle=["sw_power_cap"]), gpu(1, throttle=["hw_thermal", "sw_power_cap"], temp_c=91)]
    assert list(detector.observe_gpu(1, hot)) == []
    (finding,) = detector.observe_gpu(2, hot)
    assert finding.key == 1 and finding.details["reasons"] == ["hw_thermal"] and "91 C" in finding.message


def test_gpu_ecc_fires_when_the_counter_rises_only() -> None:
    detector = GpuEcc()
    assert list(detector.observe_gpu(1, [gpu(0, ecc_errors=0), gpu(1, ecc_errors=None)])) == []
    (finding,) = detector.observe_gpu(2, [gpu(0, ecc_errors=3)])
    assert finding.resolved_severity() == "critical" and finding.details["new_errors"] == 3
    assert list(detector.observe_gpu(3, [gpu(0, ecc_errors=3)])) == []
    (again,) = detector.observe_gpu(4, [gpu(0, ecc_errors=4)])
    assert again.details["new_errors"] == 1


# -- loss not decreasing -------------------------------------------------------------------------


def run_steps(detector: Detector, series: Iterable[dict[str, float]]) -> list[tuple[int, Finding]]:
    found = []
    for step, metrics in enumerate(series, start=1):
        found.extend((step, f) for f in detector.observe_step(step, metrics))
    return found


def test_loss_plateau_fires_on_a_loss_stuck_at_chance_and_says_so() -> None:
    rng = random.Random(0)
    stuck = [{"loss": math.log(10) * math.exp(rng.gauss(0, 0.03)), "lr": 1e-3} for _ in range(200)]
    found = run_steps(LossPlateau(), stuck)
    assert found and found[0][0] == 130, "settle 10 + reference 30 + patience 90"
    finding = found[0][1]
    assert finding.kind == "loss_plateau" and finding.resolved_severity() == "warning"
    assert finding.details["chance_level_classes"] == 10 and "log(10)" in finding.message
    assert abs(finding.details["change"]) < 0.02 and finding.details["likely_causes"]


def test_chance_loss_names_a_run_at_chance_at_once_and_a_relapse_within_a_few_steps() -> None:
    """Ten classes: a run that starts at chance is named when its window first fills (settle 10 +
    window 48); one that learned and then falls back to chance (labels shuffled mid-run) is named
    once the window is mostly at chance, a few steps later at most than a judgement at every step
    would; one corrupted batch among learned losses never is."""
    rng = random.Random(0)
    chance = math.log(10)

    def detector(judge_every: int = ChanceLoss.JUDGE_EVERY) -> ChanceLoss:
        found = ChanceLoss()
        found.context = TrainingContext(classes=10)
        found.JUDGE_EVERY = judge_every
        return found

    at_chance = [{"loss": chance * math.exp(rng.gauss(0, 0.01)), "lr": 0.1, "grad_norm": 1.0}
                 for _ in range(120)]
    found = run_steps(detector(), at_chance)
    assert found and found[0][0] == 58 and found[0][1].kind == "chance_loss"
    assert "chance level" in found[0][1].message

    learned = [{"loss": 0.3 * math.exp(rng.gauss(0, 0.05)), "lr": 0.1, "grad_norm": 1.0} for _ in range(200)]
    learned[150]["loss"] = 70.0  # one corrupted batch: clipped, it does not lift the window's mean
    assert run_steps(detector(), learned) == []
    relapse = run_steps(detector(), learned + at_chance)
    judged_every_step = run_steps(detector(judge_every=1), learned + at_chance)
    assert relapse[0][1].kind == "chance_loss" and 24 <= judged_every_step[0][0] - len(learned) <= 48
    assert 0 <= relapse[0][0] - judged_every_step[0][0] <= 3, "named at most 3 steps later"


@pytest.mark.parametrize("seed", range(4))
def test_loss_plateau_stays_quiet_on_learning_runs(seed: int) -> None:
    rng = random.Random(seed)
    noisy = [{"loss": v, "lr": 1e-3} for v in noisy_descent(seed, steps=2000, noise=0.3)]
    assert run_steps(LossPlateau(), noisy) == [], "falls, then converges: never a plateau"
    # Slow but steady: 3 % per 100 steps under 2 % batch noise (cross-entropy at batch 32, small lr).
    slow = [{"loss": 2.3 * (1 - 0.0003 * s) * math.exp(rng.gauss(0, 0.02)), "lr": 1e-4} for s in range(300)]
    assert run_steps(LossPlateau(), slow) == []


def test_loss_plateau_waits_for_the_end_of_a_warmup_from_zero() -> None:
    flat = [{"loss": 2.0, "lr": 1e-3 * min(1.0, s / 500)} for s in range(550)]
    assert run_steps(LossPlateau(), flat) == [], "lr rising: no progress is expected yet"
    # Counted from the first step after the rise (step 502): 130 counted steps later.
    assert next(step for step, _ in run_steps(LossPlateau(), flat + flat[-1:] * 130)) == 631
    zero_lr = [{"loss": 2.0, "lr": 0.0}] * 300
    assert run_steps(LossPlateau(), zero_lr) == [], "lr 0 is the invariants' optimizer_noop"


# -- gradients ------------------------------------------------------------------------------------


def grad_norms(seed: int, steps: int = 3000, noise: float = 0.3) -> list[float]:
    rng = random.Random(seed)
    return [(0.5 + 3.0 * math.exp(-s / 200)) * math.exp(rng.gauss(0.0, noise)) for s in range(steps)]


@pytest.mark.parametrize("seed", range(4))
def test_grad_explosion_stays_quiet_on_noisy_norms_and_single_spikes(seed: int) -> None:
    norms = grad_norms(seed)
    for spike in (500, 1500, 2500):  # one bad batch each: a loss spike, not an explosion
        norms[spike] *= 100
    assert run_steps(GradExplosion(), [{"grad_norm": n} for n in norms]) == []


def test_grad_explosion_fires_after_a_few_high_steps_of_a_divergence() -> None:
    norms = grad_norms(0, steps=300) + [0.6 * 2.0**k for k in range(1, 20)]
    found = run_steps(GradExplosion(), [{"grad_norm": n, "loss": 1.0} for n in norms])
    first_step, finding = found[0]
    details = finding.details
    assert first_step == details["high_since_step"] + 2 > 300, "three high observations in a row"
    assert details["consecutive"] == 3 and details["ratio"] >= 10
    assert details["grad_norm_then"] < details["grad_norm"], "it keeps growing"
    assert run_steps(GradExplosion(), [{"grad_norm": math.nan}] * 50) == [], "nonfinite_grad's job"


def params(*stats: tuple[str, tuple[int, ...], float | None, float | None, float | None], lr: float = 0.1
           ) -> tuple[ParamStat, ...]:
    return tuple(ParamStat(name, shape, lr, grad, norm, ratio) for name, shape, grad, norm, ratio in stats)


def module(name: str, dead: float, zero: float, rows: int = 32) -> ModuleStat:
    values = dict.fromkeys(ACTIVATION_FIELDS, 0.0) | {"dead_frac": dead, "zero_frac": zero}
    return ModuleStat(name, "ReLU", values, rows)


def test_nonfinite_gradients_and_weights_are_named_and_loss_nan_is_reported_once() -> None:
    sample = LayerSample(params(("a.weight", (4, 4), math.inf, 2.0, None),
                                ("b.weight", (4, 4), 1.0, math.nan, None)))
    (grads,) = NonFiniteGrads().observe_layers(7, sample, {"loss": 0.5})
    assert grads.resolved_severity() == "critical" and grads.details["params"] == ["a.weight"]
    assert NonFiniteGrads().observe_layers(7, sample, {"loss": math.nan}) == (), "the loss's event says it"
    (weights,) = NonFiniteParams().observe_layers(7, sample, {})
    assert weights.kind == "nonfinite_param" and weights.details["params"] == ["b.weight"]
    events, emit = collector()
    detectors = DetectorSet([NonFiniteLoss()], emit)
    detectors.observe_step(3, {"loss": 0.4})
    detectors.observe_step(4, {"loss": math.nan}, LayerSample(sample.params, complete=False))
    [(step, event)] = events
    assert (step, event["kind"], event["count"]) == (4, "nonfinite_loss", 1), "one finding, enriched"
    assert event["details"]["nonfinite_grads"] == ["a.weight"] and event["details"]["last_finite_loss"] == 0.4


def test_vanishing_gradient_compares_the_first_and_last_weights() -> None:
    detector = VanishingGradient()
    vanishing = LayerSample(params(
        ("emb.weight", (1000, 8), 0.0, 1.0, None),  # exactly zero: a cut graph, not vanishing
        ("0.weight", (16, 8), 1e-9, 1.0, None), ("0.bias", (16,), 1e-9, 1.0, None),
        ("frozen.weight", (16, 16), None, 1.0, None), ("9.weight", (1, 16), 0.5, 1.0, None),
    ))
    assert not detector.observe_layers(1, vanishing, {}), "confirmed on the next sample"
    (finding,) = detector.observe_layers(2, vanishing, {})
    assert (finding.details["first_layer"], finding.details["last_layer"]) == ("0.weight", "9.weight")
    assert finding.details["first_to_last"] < 1e-3 and "0.weight" in finding.message
    healthy = LayerSample(params(("0.weight", (16, 8), 0.02, 1.0, None),
                                 ("9.weight", (1, 16), 0.5, 1.0, None)))
    assert not detector.observe_layers(3, healthy, {}) and not detector.observe_layers(4, vanishing, {})


def test_update_ratio_flags_a_jump_but_not_warmup_frozen_layers_or_convergence() -> None:
    detector = UpdateRatio()
    steady = [("w", (8, 8), 1.0, 4.0, 1e-3), ("b", (8,), 1.0, 0.1, 0.5), ("frozen", (8, 8), None, 4.0, None)]
    for step in range(1, 7):
        assert detector.observe_layers(step, LayerSample(params(*steady)), {}) == [], "biases are not judged"
    (finding,) = detector.observe_layers(7, LayerSample(params(("w", (8, 8), 1.0, 4.0, 0.1))), {"lr": 0.1})
    assert finding.kind == "update_ratio" and finding.details["direction"] == "high"
    assert finding.details["params"]["w"]["typical"] == pytest.approx(1e-3) and "100x" in finding.message
    warmup = UpdateRatio()
    for step, ratio in enumerate([1e-9, 1e-7, 1e-5, 1e-4, 2e-4, 3e-4, 4e-4], start=1):
        lr = 0.0 if step == 1 else 1e-3 * step / 7
        sample = LayerSample(params(("w", (8, 8), 1.0, 4.0, ratio), lr=lr))
        assert warmup.observe_layers(step, sample, {}) == []
    too_big = UpdateRatio().observe_layers(1, LayerSample(params(("w", (8, 8), 1.0, 1.0, 20.0))), {})
    assert [f.details["direction"] for f in too_big] == ["high"], "SageMaker: above 10 at once"


def test_update_ratio_flags_updates_that_vanish_but_not_a_converged_or_noop_step() -> None:
    swallowed = LayerSample(params(("w", (8, 8), 1.0, 1.0, 1e-10), lr=0.1))  # lr*g/w = 0.1
    detector = UpdateRatio()
    assert detector.observe_layers(1, swallowed, {}) == []
    (finding,) = detector.observe_layers(2, swallowed, {})
    assert finding.details["direction"] == "low" and finding.key == "low"
    converged = LayerSample(params(("w", (8, 8), 1e-12, 1.0, 1e-13), lr=0.1))
    noop = LayerSample(params(("w", (8, 8), 1.0, 1.0, 0.0), lr=0.1))
    quiet = UpdateRatio()
    assert all(quiet.observe_layers(s, sample, {}) == [] for s, sample in enumerate([converged, noop] * 3))


def test_dead_activations_need_enough_rows_unless_everything_is_zero() -> None:
    detector = DeadActivations()
    healthy = LayerSample((), (module("1", 0.02, 0.5), module("3", 0.05, 0.6)))
    assert not detector.observe_layers(1, healthy, {})
    dead = LayerSample((), (module("1", 0.9, 0.95), module("3", 0.8, 0.9)))
    (finding,) = detector.observe_layers(2, dead, {})
    assert set(finding.details["modules"]) == {"1", "3"} and finding.message.startswith("1 (ReLU)")
    one_sample = LayerSample((), (module("1", 0.75, 0.75, rows=1),))
    assert not DeadActivations().observe_layers(1, one_sample, {}), "a batch of one says little"
    all_zero = LayerSample((), (module("1", 1.0, 1.0, rows=1),))
    assert len(DeadActivations().observe_layers(1, all_zero, {})) == 1


def test_layer_detectors_skip_partial_samples_without_ageing_their_episodes() -> None:
    events, emit = collector()
    detectors = DetectorSet([NonFiniteParams()], emit, min_update_s=0.0)
    bad = LayerSample(params(("w", (2, 2), 1.0, math.nan, None)))
    detectors.observe_step(10, {"loss": 1.0}, bad)
    for step in range(11, 20):  # gradients-only samples of steps whose gradient norm was not finite
        detectors.observe_step(step, {"loss": 1.0}, LayerSample(params(("w", (2, 2), math.nan, None, None)),
                                                                 complete=False))
    detectors.observe_step(20, {"loss": 1.0}, bad)
    assert [(b["id"], b["count"]) for _, b in events] == [("0-0", 1), ("0-0", 2)], "one episode"


# -- speed and memory ----------------------------------------------------------------------------


def steps_of(times: list[float], **extra: float) -> list[dict[str, float]]:
    return [{"step_time": t, **extra} for t in times]


def test_throughput_drop_fires_on_a_lasting_drop_only() -> None:
    rng = random.Random(1)
    normal = [0.05 * math.exp(rng.gauss(0, 0.1)) for _ in range(200)]
    evaluations = [5.0 if i % 50 == 49 else t for i, t in enumerate(normal)]  # an eval pause every 50
    assert run_steps(ThroughputDrop(), steps_of(evaluations)) == []
    blip = normal[:100] + [0.15] * 10 + normal[100:]  # 1.5 s of slow steps, not a whole window
    assert run_steps(ThroughputDrop(), steps_of(blip)) == []
    drop = normal[:100] + [0.12] * 60
    found = run_steps(ThroughputDrop(), steps_of(drop))
    assert found and 110 <= found[0][0] <= 125
    details = found[0][1].details
    assert details["ratio"] == pytest.approx(0.05 / 0.12, rel=0.1) and details["metric"] == "steps_per_s"
    fast_blip = [0.001] * 100 + [0.004] * 30 + [0.001] * 20  # 2 ms of a millisecond loop: noise
    assert run_steps(ThroughputDrop(), steps_of(fast_blip)) == []


def test_a_step_time_jump_is_named_within_ten_steps_or_a_second() -> None:
    """A per-step debug routine makes every step 17x slower from step 100: named within 10 steps or 1 s."""
    rng = random.Random(3)
    normal = [0.01 * math.exp(rng.gauss(0, 0.1)) for _ in range(100)]
    debug = normal + [0.17 * math.exp(rng.gauss(0, 0.1)) for _ in range(50)]
    found = run_steps(ThroughputDrop(), steps_of(debug))
    assert found and found[0][0] == 105, "five slow steps (0.85 s)"
    details = found[0][1].details
    assert details["slower_by"] == pytest.approx(17, rel=0.2) and details["since_step"] == 101
    fast = [0.001] * 300 + [0.0035] * 400  # a millisecond loop 3.5x slower: after half a second
    first = run_steps(ThroughputDrop(), steps_of(fast))[0][0]
    assert 300 + 140 <= first <= 300 + 150
    hiccup = [0.001] * 300 + [0.0035] * 20 + [0.001] * 100  # 70 ms of slow steps: noise
    assert run_steps(ThroughputDrop(), steps_of(hiccup)) == []


def with_cpu_wait(times: list[float], waits: list[float], every: int = 10) -> list[dict[str, float]]:
    """Steps whose every ``every``-th carries a ``cpu_wait`` reading (as the Monitor reads it)."""
    return [{"step_time": t, **({"cpu_wait": w} if i % every == 0 else {})}
            for i, (t, w) in enumerate(zip(times, waits, strict=True))]


def test_a_slowdown_from_waiting_for_a_cpu_is_not_the_loops_own_until_it_lasts() -> None:
    """Other processes taking the CPUs for a couple of seconds: the thread waited ~90 % of the
    time. The loop's own time did not change: no jump. The same slowdown with no wait is the loop's."""
    times = [0.01] * 100 + [0.1] * 30 + [0.01] * 100
    waits = [0.0] * 100 + [0.9] * 30 + [0.0] * 100
    assert run_steps(ThroughputDrop(), with_cpu_wait(times, waits)) == []
    own = run_steps(ThroughputDrop(), with_cpu_wait(times, [0.0] * len(times)))
    assert own and own[0][1].details["slower_by"] == pytest.approx(10, rel=0.1)
    lasting = [0.01] * 100 + [0.1] * 150  # 15 s of it: named as contention, once it lasted 10 s
    found = run_steps(ThroughputDrop(), with_cpu_wait(lasting, [0.0] * 100 + [0.9] * 150))
    assert {f.details.get("test") for _, f in found} == {"cpu contention"}
    assert 190 <= found[0][0] <= 200 and found[0][1].details["cpu_wait"] == pytest.approx(0.9)
    assert "other processes are taking the CPUs" in found[0][1].message


def test_a_pause_is_no_slowdown_and_the_cpu_wait_reading_over_it_is_left_out() -> None:
    """A busy 8 s validation pass every 60 steps of 50 ms, on a machine where the loop waits for a
    CPU a little over half the time: the pause's reading (its own torch threads made the training
    thread wait 70 % of it) once filled the 10 s contention window at the first pass and raised
    throughput_drop at every pass. Pauses (publisher.wire.stall.pause_s) count in no test; the
    steps around them (7 s in all) are too short to judge contention on."""
    times = [8.0 if i % 60 == 59 else 0.05 for i in range(150)]
    waits = [0.7 if i % 60 == 59 else 0.55 for i in range(150)]
    assert run_steps(ThroughputDrop(), with_cpu_wait(times, waits, every=1)) == []
    longer = [8.0 if i % 60 == 59 else 0.05 for i in range(300)]  # 14 s of steps: that is contention
    found = run_steps(ThroughputDrop(), with_cpu_wait(longer, [0.55] * 300, every=1))
    assert found and {f.details.get("test") for _, f in found} == {"cpu contention"}
    assert found[0][0] > 200 and found[0][1].details["seconds"] < 12, "judged on the steps alone"


def test_more_work_per_step_at_the_same_throughput_is_no_slowdown() -> None:
    """Longer sequences: 4x the tokens per step, 4x the step time, the same tokens per second."""
    short = [{"step_time": 0.01, "tokens_per_s": 512 / 0.01}] * 100
    long = [{"step_time": 0.04, "tokens_per_s": 2048 / 0.04}] * 100
    assert run_steps(ThroughputDrop(), short + long) == []


def test_periodic_evaluation_pauses_are_one_info_episode() -> None:
    events, emit = collector()
    detectors = DetectorSet([StepTimeOutlier(), ThroughputDrop()], emit, min_update_s=0.0)
    rng = random.Random(2)
    for step in range(1, 501):
        pause = step % 100 == 0
        detectors.observe_step(step, {"step_time": 3.0 if pause else 0.05 * math.exp(rng.gauss(0, 0.2))})
    assert {b["kind"] for _, b in events} == {"step_time_outlier"}
    assert {b["severity"] for _, b in events} == {"info"} and len({b["id"] for _, b in events}) == 1
    assert events[-1][1]["count"] == 5


def test_a_step_as_long_as_a_stall_is_left_to_the_stall_events() -> None:
    """A 12 s step (a rank blocked in its data fetch) was a ``hang`` while it lasted, closed with its
    length when it ended: no ``step_time_outlier`` repeats it. A 3 s pause is still one."""
    steady = [{"step_time": 0.05}] * 60
    assert run_steps(StepTimeOutlier(), [*steady, {"step_time": 12.0}, *steady]) == []
    [(step, finding)] = run_steps(StepTimeOutlier(), [*steady, {"step_time": 3.0}, *steady])
    assert step == 61 and finding.kind == "step_time_outlier"


def test_data_bottleneck_needs_most_steps_of_the_window() -> None:
    healthy = [{"step_time": 0.02, "data_time": 0.002}] * 40
    one_slow = [*healthy[:30], {"step_time": 0.5, "data_time": 0.48}, *healthy[:20]]
    assert run_steps(DataBottleneck(), one_slow) == []
    starving = healthy[:30] + [{"step_time": 0.03, "data_time": 0.021}] * 20
    found = run_steps(DataBottleneck(), starving)
    assert found[0][0] == 41, "from the 11th slow step the median is over the line"
    assert found[0][1].details["data_share"] == pytest.approx(0.7)


MIB = 1024 * 1024
#: A leak budget of 1 GiB (the detector's default on a host with 10 GiB or more available), so
#: that these tests do not depend on this machine's free memory: a climb is named from +256 MiB.
GIB = 1024 * MIB


def test_memory_growth_fires_on_a_steady_climb_not_on_warmup_or_a_step_up() -> None:
    warmup = [300 * MIB + 40 * MIB * min(s, 20) / 20 for s in range(40)]  # allocators filling up
    plateau = [warmup[-1] + (100 * MIB if s >= 60 else 0) for s in range(40, 200)]  # first eval: +100 MiB
    series = [{"host_mem_bytes": v} for v in warmup + plateau]
    assert run_steps(MemoryGrowth(budget_bytes=GIB), series) == []
    leak = [{"host_mem_bytes": 340 * MIB + 5 * MIB * s, "cuda_mem_allocated": 1e9} for s in range(120)]
    found = run_steps(MemoryGrowth(budget_bytes=GIB), leak)
    first_step, finding = found[0]
    assert 70 <= first_step <= 100, "once the floor (lowest of 4 readings, every 4th step) grew 256 MiB"
    assert finding.key == "host_mem_bytes"
    assert finding.details["bytes_per_step"] == pytest.approx(5 * MIB, rel=0.05)
    assert finding.details["leak_budget_bytes"] == GIB
    cuda_leak = [{"cuda_mem_allocated": 2e9 + 2e8 * s} for s in range(120)]
    assert {f.key for _, f in run_steps(MemoryGrowth(budget_bytes=GIB), cuda_leak)} == {"cuda_mem_allocated"}


def test_memory_growth_is_quiet_on_bounded_growth_that_climbs_steadily_then_stops() -> None:
    """Persistent DataLoader workers and a heavy model: the resident set climbs ~120 MiB, steadily,
    reading after reading, for forty steps, then stays flat; and it saws up and down by ~48 MiB as
    shared-memory batches are mapped and freed. Neither is a leak; a leak on top of it is one."""
    def resident(step: int, leak: float = 0.0) -> float:
        climb = 120 * MIB * min(max(step - 20, 0), 40) / 40
        saw = 48 * MIB if step % 7 in (3, 4) else 0.0  # a batch mapped for two readings of seven
        return 400 * MIB + climb + saw + leak * max(step - 150, 0)

    slow_steps = [{"host_mem_bytes": resident(s), "step_time": 0.1} for s in range(400)]  # read every step
    assert run_steps(MemoryGrowth(budget_bytes=GIB), slow_steps) == []
    fast_steps = [{"host_mem_bytes": resident(s), "step_time": 0.01} for s in range(400)]
    assert run_steps(MemoryGrowth(budget_bytes=GIB), fast_steps) == []
    leaking = [{"host_mem_bytes": resident(s, leak=3 * MIB), "step_time": 0.1} for s in range(400)]
    found = run_steps(MemoryGrowth(budget_bytes=GIB), leaking)
    assert found, "3 MiB a step from step 150, on top of the warm-up and the saw"
    assert 3 * MIB * (found[0][0] - 150) < GIB, "named before it took the budget"


def test_memory_growth_settling_is_quiet_and_a_slow_leak_is_named_within_the_budget() -> None:
    """Workers starting and prefetch filling add memory fast, then slower and slower: quiet however
    much it adds. A leak keeps its pace, however slow, and is named before it takes the budget."""
    settling = [{"host_mem_bytes": 500 * MIB + 300 * MIB * (1 - math.exp(-s / 6)), "step_time": 0.01}
                for s in range(600)]
    assert run_steps(MemoryGrowth(budget_bytes=GIB), settling) == []
    # 2 MiB a step from step 100, memory read every 4th step.
    fast_leak = [{"step_time": 0.01, **({"host_mem_bytes": 500 * MIB + 2 * MIB * max(0, s - 100)}
                                         if s % 4 == 0 else {})} for s in range(600)]
    first = run_steps(MemoryGrowth(budget_bytes=GIB), fast_leak)[0][0]
    assert 2 * MIB * (first - 100) < GIB / 2
    rng = random.Random(0)  # 0.5 MiB a step under +-4 MiB of noise: neighbouring floors disagree
    slow_leak = [{"host_mem_bytes": (500 + 0.5 * s + rng.uniform(-4, 4)) * MIB} for s in range(1200)]
    found = run_steps(MemoryGrowth(budget_bytes=GIB), slow_leak)
    assert found and 0.5 * MIB * found[0][0] < GIB, "named from the climb's spread-out floors"
    assert found[0][1].details["bytes_per_step"] == pytest.approx(0.5 * MIB, rel=0.1)


def test_memory_growth_budget_is_a_tenth_of_available_memory_at_most_one_gib() -> None:
    budget = MemoryGrowth().budget_bytes
    assert 0 < budget <= GIB
    assert budget == pytest.approx(min(GIB, 0.1 * psutil.virtual_memory().available), rel=0.2)


def test_lr_vanished_names_a_per_epoch_decay_stepped_every_batch_with_its_course() -> None:
    per_batch = [{"lr": 0.1 * 0.9**s, "lr/1": 0.0} for s in range(400)]  # group 1 frozen at 0
    found = run_steps(LrVanished(), per_batch)
    step, finding = found[0]
    assert step == 89 + 50, "below 1e-4 of the peak from step 89, for 50 steps"
    assert finding.key == "lr" and finding.details["peak_lr"] == 0.1
    assert finding.details["low_since_step"] == 89
    falls = [point["step"] for point in finding.details["lr_history"]]
    assert falls[:3] == [1, 23, 45], "each tenfold fall: 0.9**22 < 0.1"
    assert "param group 0" in finding.message and "float32" in finding.message


def test_lr_vanished_is_quiet_on_schedules_that_reach_zero_at_their_planned_end() -> None:
    steps = 20_000
    cosine = [{"lr": 0.05 * (1 + math.cos(math.pi * s / steps)) / 2} for s in range(steps + 1)]
    warmup_linear = [{"lr": 3e-4 * (s / 500 if s < 500 else (steps - s) / (steps - 500))}
                     for s in range(steps + 1)]
    quadratic = [{"lr": 1e-3 * (1 - s / steps) ** 2} for s in range(steps + 1)]
    exactly_zero = [{"lr": 0.1 if s < 100 else 0.0} for s in range(400)]  # optimizer_noop's
    for series in (cosine, warmup_linear, quadratic, exactly_zero):
        assert run_steps(LrVanished(), series) == []


def _unmoved_run(samples: Iterable[tuple[int, float, float, float]]) -> list[tuple[int, Finding]]:
    """Samples of two weights at (step, lr, gradient norm, update ratio); the steps between samples
    observed too, as the Monitor observes every step."""
    detector, found, previous = LrVanished(), [], 0
    for step, lr, grad, ratio in samples:
        for between in range(previous + 1, step):
            found += [(between, f) for f in detector.observe_step(between, {"lr": lr})]
        sample = LayerSample(params(("0.weight", (8, 8), grad, 1.0, ratio),
                                    ("1.weight", (8, 8), grad, 2.0, ratio), lr=lr))
        findings = list(detector.observe_step(step, {"lr": lr}))
        findings += [f for f in detector.observe_layers(step, sample, {"lr": lr}) if f not in findings]
        found += [(step, f) for f in findings]
        previous = step
    return found


def test_lr_vanished_names_a_rate_too_small_from_the_start_once_the_samples_see_nothing_move() -> None:
    typo = [(step, 1e-9, 0.5, 0.0) for step in (*range(1, 11), 20, 30, 40)]
    found = _unmoved_run(typo)
    assert found and found[0][0] == 20, "three unmoved samples spanning 10 steps: the one at step 20"
    finding = found[0][1]
    assert finding.kind == "lr_vanished" and finding.details["cause"] == "below_resolution"
    assert set(finding.details["params"]) == {"0.weight", "1.weight"}
    assert "did not move" in finding.message and "1e-09" in finding.message
    assert {step for step, _ in found} == set(range(20, 41)), "one episode, held between samples"


def test_lr_vanished_leaves_warm_up_convergence_lost_updates_and_decay_tails_to_others() -> None:
    warm_up = [(step, 1e-10 * step, 0.5, 0.0) for step in range(1, 60)]  # rising: wait for it
    converged = [(step, 0.1, 0.5 if step < 5 else 1e-8, 0.0) for step in range(1, 60)]  # grads gone
    lost_on_the_way = [(step, 0.1, 0.5, 0.0) for step in range(1, 60)]  # fp16 weights: update_ratio's
    decay_tail = [(step, 0.1 if step < 5 else 1e-9, 0.5, 0.0) for step in range(1, 60)]  # the lr rule's
    moving = [(step, 1e-9, 0.5, 1e-6) for step in range(1, 60)]
    # A deep stack whose first layers get gradients 1e-21 of their weights from the start: Adam's
    # eps swallows them and nothing moves at lr 1e-3, but no rate is to blame (vanishing_gradient's).
    vanished = [(step, 1e-3, 1e-21, 0.0) for step in range(1, 60)]
    for samples in (warm_up, converged, lost_on_the_way, decay_tail, moving, vanished):
        assert [f for _, f in _unmoved_run(samples) if f.key == "below_resolution"] == []


# -- GPU utilisation -----------------------------------------------------------------------------


def test_gpu_low_util_judges_only_samples_taken_while_training() -> None:
    detector = GpuLowUtil(window=10, idle_after_s=0.05)
    idle = [gpu(0, 0.0), gpu(1, 0.0)]
    assert all(detector.observe_gpu(None, idle) == () for _ in range(30)), "before the first step"
    starved = [gpu(0, 30.0), gpu(1, 35.0), gpu(2, 0.0)]  # GPU 2 is not used by this job
    found = [detector.observe_gpu(step // 2, starved) for step in range(12, 32)]  # 2 samples a step
    assert found[:9] == [()] * 9, "a full window first"
    (finding,) = found[9]
    assert finding.details["p95"] == {"0": 30.0, "1": 35.0} and "GPU 1 35%" in finding.message
    paused = GpuLowUtil(window=10, idle_after_s=0.05)
    low = [gpu(0, 5.0), gpu(1, 5.0)]
    paused.observe_gpu(1, low)
    time.sleep(0.06)  # an evaluation: the step does not move, the GPUs idle
    assert all(paused.observe_gpu(1, low) == () for _ in range(30))
    slow_steps = GpuLowUtil(window=10, idle_after_s=10.0)  # the same samples within a long step: counted
    assert [len(slow_steps.observe_gpu(1, low)) for _ in range(10)] == [0] * 9 + [1]
    busy = GpuLowUtil(window=10)
    one_idle = [gpu(0, 95.0), gpu(1, 10.0)]
    assert all(busy.observe_gpu(step, one_idle) == () for step in range(1, 30)), "gpu_imbalance's"


def test_the_detectors_run_in_the_publishers_process_read_nothing_but_a_steps_metrics() -> None:
    """A detector moved where only the published metrics are would silently lose its layer,
    batch or loss-call observations: each listed one has ``observe_step`` as its only hook, and
    the default suite parts into the rest and those, nothing lost or doubled."""
    for cls in ON_PUBLISHED_METRICS.values():
        detector = cls()
        hooks = [hook for hook in ("observe_step", "observe_layers", "observe_batches",
                                   "observe_loss_calls", "observe_gpu") if overrides(detector, hook)]
        assert hooks == ["observe_step"], (cls.__name__, hooks)
    defaults = default_detectors()
    here, there = split_defaults(defaults)
    assert sorted([type(d).__name__ for d in here] + there) == sorted(type(d).__name__ for d in defaults)
    assert set(there) == set(ON_PUBLISHED_METRICS)
