"""The episode logic that turns detectors' findings into few, useful events, and the set that runs them.

A :class:`~publisher.findings.Detector` looks at one observation at a time (a step's metrics, a
sampled per-layer statistic, or one GPU sample) and returns :class:`~publisher.findings.Finding` s:
"this looks wrong now, here are the numbers". It keeps whatever history it needs. The
:class:`EpisodeTracker` owns the other half of the job, which every detector would otherwise redo:
a finding that repeats step after step is ONE episode, announced once as an ``event`` and then
re-sent with the same ``id`` and a higher ``count`` at a bounded rate; the episode ends after
``quiet_to_close`` observations without a finding, and a later finding opens a new one.
:class:`DetectorSet` runs detectors and never lets one that breaks stop the others or the training.

Adding a detector: subclass :class:`~publisher.findings.Detector` in a ``publisher/detect_*.py``
module, override ``observe_step``, ``observe_layers`` and/or ``observe_gpu``, return findings whose
``kind`` is in :data:`publisher.event_kinds.EVENT_KINDS` (a runbook exists for each), and say in the
docstring where its defaults come from (``shared/notes/prior-art.md`` collects the sources).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from publisher.detect_gpu import GpuEcc, GpuImbalance, GpuLowUtil, GpuThrottle
from publisher.detect_grads import (
    DeadActivations,
    GradExplosion,
    NonFiniteGrads,
    NonFiniteParams,
    UpdateRatio,
    VanishingGradient,
)
from publisher.detect_loss import LossPlateau, LossSpike, NonFiniteLoss
from publisher.detect_speed import DataBottleneck, MemoryGrowth, StepTimeOutlier, ThroughputDrop
from publisher.findings import Detector, Devices, Finding, Metrics, overrides
from publisher.jsonsafe import json_safe
from publisher.layer_sample import LayerSample
from publisher.protocol import SEVERITIES

__all__ = [
    "DataBottleneck",
    "DeadActivations",
    "Detector",
    "DetectorSet",
    "EpisodeTracker",
    "Finding",
    "GpuEcc",
    "GpuImbalance",
    "GpuLowUtil",
    "GpuThrottle",
    "GradExplosion",
    "LossPlateau",
    "LossSpike",
    "MemoryGrowth",
    "NonFiniteGrads",
    "NonFiniteLoss",
    "NonFiniteParams",
    "StepTimeOutlier",
    "ThroughputDrop",
    "UpdateRatio",
    "VanishingGradient",
    "default_detectors",
]

log = logging.getLogger(__name__)


def default_detectors() -> list[Detector]:
    """The detectors a Monitor runs unless told otherwise (a fresh instance each call).

    Each takes its thresholds as constructor arguments; pass your own list to ``Monitor(detectors=...)``
    to change them, e.g. ``[*default_detectors()[:-1], GpuLowUtil(p95=50)]``.
    """
    return [
        NonFiniteLoss(), LossSpike(), LossPlateau(),
        GradExplosion(), NonFiniteGrads(), NonFiniteParams(), VanishingGradient(), UpdateRatio(),
        DeadActivations(),
        ThroughputDrop(), StepTimeOutlier(), DataBottleneck(), MemoryGrowth(),
        GpuImbalance(), GpuThrottle(), GpuEcc(), GpuLowUtil(),
    ]


# -- episodes ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Episode:
    id: str
    kind: str
    severity: str
    first_step: int | None
    last_step: int | None
    message: str
    details: dict[str, Any]
    count: int = 1
    sent_count: int = 0
    sent_at: float = 0.0
    quiet: int = 0


#: Emits one event body: ``emit(step, body)`` where body has id, severity, kind, message,
#: details, count (the Monitor hands it to ``Publisher.publish("event", step=step, **body)``).
EmitEvent = Callable[[int | None, dict[str, Any]], None]

_SEVERITY_RANK = {name: i for i, name in enumerate(SEVERITIES)}


class EpisodeTracker:
    """Folds repeated findings into episodes: one event per episode, updates rate-limited.

    Episodes belong to an owner (a detector): only that owner's observations age them, so a GPU
    detector sampled once a second and a loss detector called 1000 times a second each end their
    episodes after their own ``quiet_to_close`` observations. Each owner is observed from one
    thread (the training loop or the GPU sampler), so the per-owner state needs no lock.
    """

    def __init__(self, emit: EmitEvent, *, rank: int = 0, min_update_s: float = 2.0) -> None:
        self.rank = rank
        self.min_update_s = min_update_s
        self._emit = emit
        self._ids = itertools.count()
        self._open: dict[int, dict[tuple[str, Any], _Episode]] = {}
        #: ``id(owner)`` of the owners that ever had an episode (a cheap test for callers).
        self.open_owners = self._open

    def new_id(self) -> str:
        """A fresh event id, unique within the run: ``"<rank>-<n>"``."""
        return f"{self.rank}-{next(self._ids)}"

    def observe(
        self, owner: object, step: int | None, findings: Sequence[Finding], quiet_to_close: int
    ) -> None:
        """Record one observation of ``owner`` and the findings it produced (maybe none)."""
        episodes = self._open.get(id(owner))
        if not findings and not episodes:
            return  # the common case, on the training thread: nothing open, nothing new
        if episodes is None:
            episodes = self._open[id(owner)] = {}
        seen = set()
        now = 0.0
        for finding in findings:
            now = now or time.monotonic()
            key = (finding.kind, finding.key)
            seen.add(key)
            episode = episodes.get(key)
            if episode is None:
                episodes[key] = episode = _Episode(
                    id=self.new_id(),
                    kind=finding.kind,
                    severity=finding.resolved_severity(),
                    first_step=step,
                    last_step=step,
                    message=finding.message,
                    details=finding.details,
                )
                self._send(episode, now)
                continue
            episode.count += 1
            episode.quiet = 0
            episode.last_step = step
            episode.message = finding.message
            episode.details = finding.details
            severity = finding.resolved_severity()
            escalated = _SEVERITY_RANK[severity] > _SEVERITY_RANK[episode.severity]
            if escalated:
                episode.severity = severity
            if escalated or now - episode.sent_at >= self.min_update_s:
                self._send(episode, now)
        if len(seen) == len(episodes):
            return
        for key in [k for k in episodes if k not in seen]:
            episode = episodes[key]
            episode.quiet += 1
            if episode.quiet >= quiet_to_close:
                del episodes[key]
                if episode.count > episode.sent_count:
                    self._send(episode, time.monotonic())

    def flush(self) -> None:
        """Send the last count of every episode whose latest repeats were held back (at close)."""
        now = time.monotonic()
        for episodes in self._open.values():
            for episode in episodes.values():
                if episode.count > episode.sent_count:
                    self._send(episode, now)

    def _send(self, episode: _Episode, now: float) -> None:
        episode.sent_count = episode.count
        episode.sent_at = now
        details = dict(episode.details, first_step=episode.first_step, last_step=episode.last_step)
        self._emit(
            episode.first_step,
            {
                "id": episode.id,
                "severity": episode.severity,
                "kind": episode.kind,
                "message": episode.message,
                "details": json_safe(details),
                "count": episode.count,
            },
        )


class DetectorSet:
    """Runs detectors on observations and feeds their findings to an :class:`EpisodeTracker`.

    A detector that raises is logged once and then skipped for good: a broken check must cost
    neither the training nor the other checks.

    Synchronous: the Monitor calls :meth:`observe_step` from its step worker's thread
    (:mod:`publisher.step_worker`), in batches, not from the training thread (measured on a CPU,
    the same detector code costs ~13 us per step between training steps, whose kernels evict its
    data and bytecode from the caches, and ~2 us in a batch); :meth:`observe_gpu` from the GPU
    sampler's thread.
    """

    def __init__(
        self,
        detectors: Iterable[Detector],
        emit: EmitEvent,
        *,
        rank: int = 0,
        min_update_s: float = 2.0,
    ) -> None:
        self.tracker = EpisodeTracker(emit, rank=rank, min_update_s=min_update_s)
        self.detectors = list(detectors)
        for detector in self.detectors:
            detector.rank = rank
        # (detector, has observe_step, has observe_layers) for the per-step observations.
        self._step_detectors = [
            (d, overrides(d, "observe_step"), overrides(d, "observe_layers"))
            for d in self.detectors
            if overrides(d, "observe_step") or overrides(d, "observe_layers")
        ]
        self._gpu_detectors = [d for d in self.detectors if overrides(d, "observe_gpu")]

    def observe_step(self, step: int, metrics: Metrics, layers: LayerSample | None = None) -> None:
        """Run the step detectors on one step; those reading layers also on its sample, if any.

        A detector's findings from both hooks make one observation; a layer finding replaces a
        step finding of the same kind and key (it knows more: which layers).
        """
        tracker = self.tracker
        open_episodes = tracker.open_owners
        for detector, on_step, on_layers in self._step_detectors:
            try:
                findings = detector.observe_step(step, metrics) if on_step else ()
                if on_layers and layers is not None and (layers.complete or detector.reads_partial_samples):
                    findings = _merge(findings, detector.observe_layers(step, layers, metrics))
                elif not on_step:
                    continue  # a layer detector ages its episodes on samples only
                if findings or id(detector) in open_episodes:  # else nothing to record: the usual case
                    tracker.observe(detector, step, findings, detector.quiet_to_close)
            except Exception:
                self._disable(detector)

    def observe_gpu(self, step: int | None, devices: Devices, *, simulated: bool = False) -> None:
        """``simulated``: the readings are not real; events say so, in words and in details."""
        observe = self.tracker.observe
        for detector in self._gpu_detectors:
            try:
                findings = detector.observe_gpu(step, devices)
                if simulated and findings:
                    findings = [_mark_simulated(finding) for finding in findings]
                observe(detector, step, findings, detector.quiet_to_close)
            except Exception:
                self._disable(detector)

    def _disable(self, detector: Detector) -> None:
        log.exception("tuimon: detector %s failed and is disabled for this run", type(detector).__name__)
        # New lists, not in-place removal: the caller is iterating over the old one.
        self._step_detectors = [entry for entry in self._step_detectors if entry[0] is not detector]
        self._gpu_detectors = [d for d in self._gpu_detectors if d is not detector]

    def close(self) -> None:
        """Send held-back episode counts (the last steps have been observed)."""
        self.tracker.flush()


def _merge(first: Sequence[Finding], second: Sequence[Finding]) -> Sequence[Finding]:
    if not second:
        return first
    if not first:
        return second
    merged = {(f.kind, f.key): f for f in first}
    merged.update({(f.kind, f.key): f for f in second})
    return list(merged.values())


def _mark_simulated(finding: Finding) -> Finding:
    return dataclasses.replace(
        finding,
        message=f"[simulated GPUs] {finding.message}",
        details={**finding.details, "simulated": True},
    )
