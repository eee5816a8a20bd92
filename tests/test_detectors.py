"""Detectors and episodes: what a user sees in the event log for healthy runs and for real faults."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Iterable
from typing import Any

import pytest

from publisher.detectors import (
    Detector,
    DetectorSet,
    EpisodeTracker,
    Finding,
    GpuEcc,
    GpuImbalance,
    GpuThrottle,
    LossSpike,
    NonFiniteLoss,
    default_detectors,
)
from publisher.event_kinds import EVENT_KINDS
from publisher.gpu import SimulatedSource

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


def test_a_broken_detector_is_disabled_and_the_others_keep_working(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(Detector):
        def observe_step(self, step: int, metrics: Any) -> Iterable[Finding]:
            raise ZeroDivisionError("bug in a detector")

    events, emit = collector()
    detectors = DetectorSet([Broken(), NonFiniteLoss()], emit)
    with caplog.at_level(logging.ERROR):
        for step in range(1, 4):
            detectors.observe_step(step, {"loss": math.nan})
    assert [b["kind"] for _, b in events] == ["nonfinite_loss"]
    assert sum("Broken" in r.getMessage() for r in caplog.records) == 1


def test_submitted_steps_are_checked_in_the_background_and_at_close() -> None:
    events, emit = collector()
    detectors = DetectorSet([NonFiniteLoss()], emit).start(interval_s=0.01)
    detectors.submit_step(1, {"loss": math.nan})
    deadline = time.monotonic() + 2.0
    while not events and time.monotonic() < deadline:
        time.sleep(0.005)
    assert [b["kind"] for _, b in events] == ["nonfinite_loss"], "checked without anyone calling observe"
    slow = DetectorSet([NonFiniteLoss()], emit).start(interval_s=60.0)
    slow.submit_step(7, {"loss": math.inf})
    slow.close()  # long before the thread's next round: close checks what is left
    assert [(step, b["kind"]) for step, b in events] == [(1, "nonfinite_loss"), (7, "nonfinite_loss")]
    detectors.close()


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
