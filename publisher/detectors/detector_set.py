"""``DetectorSet``: runs detectors on observations and folds their findings into events.

A :class:`~publisher.detectors.base.Detector` looks at one observation at a time (a step's
metrics, a sampled per-layer statistic, or one GPU sample) and returns
:class:`~publisher.detectors.base.Finding` s: "this looks wrong now, here are the numbers". It keeps
whatever history it needs. :class:`DetectorSet` runs detectors, hands their findings to an
:class:`~publisher.detectors.episodes.EpisodeTracker` (one event per episode), and never lets one
that breaks stop the others or the training: a detector that raises loses that observation only,
its failure is a part's failure (:mod:`publisher.telemetry_errors`: told once as a
``telemetry_error`` event, the detector switched off once it has failed often enough). It imports
no torch: the publisher's process runs one too (:mod:`publisher.detectors.published`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from publisher.detectors.base import Detector, Devices, Finding, Metrics, TrainingContext, overrides
from publisher.detectors.episodes import EmitEvent, EpisodeTracker
from publisher.telemetry_errors import TelemetryErrors
from publisher.wire.jsonsafe import json_safe

if TYPE_CHECKING:
    from publisher.patches.loss_look import LossLook
    from publisher.readings.batches import BatchPrint
    from publisher.stats.layer_sample import LayerSample

#: The hooks a detector may read a step with, in the order they run.
_STEP_HOOKS = ("observe_step", "observe_layers", "observe_batches", "observe_loss_calls")


class DetectorSet:
    """Runs detectors on observations and feeds their findings to an :class:`EpisodeTracker`.

    A detector that raises loses that observation, and is told to ``errors`` (the Monitor's, or
    one of the set's own whose events it emits itself); once its part is switched off there
    (:data:`~publisher.telemetry_errors.OFF_AFTER` failures) it is skipped for good: a broken check
    must cost neither the training nor the other checks.

    Synchronous: the Monitor calls :meth:`observe_step` from its step worker's thread
    (:mod:`publisher.threads.step_worker`), in batches, not from the training thread (measured on a CPU,
    the same detector code costs ~13 us per step between training steps, whose kernels evict its
    data and bytecode from the caches, and ~2 us in a batch); :meth:`observe_gpu` from the GPU
    sampler's thread. The publisher's process runs one on the metrics it publishes
    (:mod:`publisher.detectors.published`).
    """

    def __init__(
        self,
        detectors: Iterable[Detector],
        emit: EmitEvent,
        *,
        rank: int = 0,
        min_update_s: float = 2.0,
        context: TrainingContext | None = None,
        id_prefix: str = "",
        errors: TelemetryErrors | None = None,
    ) -> None:
        self.tracker = EpisodeTracker(emit, rank=rank, min_update_s=min_update_s, id_prefix=id_prefix)
        self._emit = emit
        if errors is None:
            errors = TelemetryErrors()
            errors.report_to(self._tell_failure)
        self._errors = errors
        self.detectors = list(detectors)
        #: What the detectors know about the training (the Monitor updates it); shared by all.
        self.context = context or TrainingContext()
        for detector in self.detectors:
            detector.rank = rank
            detector.context = self.context
        # (detector, has observe_step, observe_layers, observe_batches, observe_loss_calls) per step.
        self._step_detectors = [
            (d, overrides(d, "observe_step"), overrides(d, "observe_layers"), overrides(d, "observe_batches"),
             overrides(d, "observe_loss_calls"))
            for d in self.detectors if any(overrides(d, hook) for hook in _STEP_HOOKS)
        ]
        self._every_step = self._those_reading_every_step()
        self._gpu_detectors = [d for d in self.detectors if overrides(d, "observe_gpu")]

    def _those_reading_every_step(self) -> list[tuple[Detector, bool, bool, bool, bool]]:
        """The step detectors that read the step itself: on a step without a sample, batches or
        looks, the others would do nothing (most steps: one loop of Python less per step)."""
        return [entry for entry in self._step_detectors if entry[1]]

    def observe_step(self, step: int, metrics: Metrics, layers: LayerSample | None = None,
                     batches: Sequence[BatchPrint] = (), looks: Sequence[LossLook] = ()) -> None:
        """Run the step detectors on one step; those reading layers also on its sample, if any,
        those reading batches on its batches' fingerprints, those reading loss calls on its looks.

        A detector's findings from its hooks make one observation; a layer finding replaces a
        step finding of the same kind and key (it knows more: which layers).
        """
        tracker = self.tracker
        open_episodes = tracker.open_owners
        entries = self._step_detectors if layers is not None or batches or looks else self._every_step
        for detector, on_step, on_layers, on_batches, on_looks in entries:
            try:
                findings = detector.observe_step(step, metrics) if on_step else ()
                if on_layers and layers is not None and (layers.complete or detector.reads_partial_samples):
                    findings = _merge(findings, detector.observe_layers(step, layers, metrics))
                elif on_batches and batches:
                    findings = _merge(findings, detector.observe_batches(step, batches))
                elif on_looks and looks:
                    findings = _merge(findings, detector.observe_loss_calls(step, looks))
                elif not on_step:
                    continue  # a layer, batch or loss-call detector ages its episodes on its own observations
                if findings or id(detector) in open_episodes:  # else nothing to record: the usual case
                    tracker.observe(detector, step, findings, detector.quiet_to_close)
            except Exception as exc:
                self._failed(detector, exc, step)

    def observe_gpu(self, step: int | None, devices: Devices, *, simulated: bool = False) -> None:
        """``simulated``: the readings are not real; events say so, in words and in details."""
        observe = self.tracker.observe
        for detector in self._gpu_detectors:
            try:
                findings = detector.observe_gpu(step, devices)
                if simulated and findings:
                    findings = [_mark_simulated(finding) for finding in findings]
                observe(detector, step, findings, detector.quiet_to_close)
            except Exception as exc:
                self._failed(detector, exc, step)

    def _failed(self, detector: Detector, exc: Exception, step: int | None) -> None:
        """A detector raised: told as its part's failure; skipped from now on once switched off."""
        part = self._errors.part(f"detector {type(detector).__name__}")
        part.failed(exc, step)
        if not part.on:
            self._disable(detector)

    def _tell_failure(self, severity: str, message: str, step: int | None, details: dict[str, Any]) -> None:
        """A detector's failure as a ``telemetry_error`` event, where the set has no reporter."""
        self._emit(step, {"id": self.tracker.new_id(), "severity": severity, "kind": "telemetry_error",
                          "message": message, "details": json_safe(details), "count": 1})

    def _disable(self, detector: Detector) -> None:
        # New lists, not in-place removal: the caller is iterating over the old one.
        self._step_detectors = [entry for entry in self._step_detectors if entry[0] is not detector]
        self._every_step = self._those_reading_every_step()
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
