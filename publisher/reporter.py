"""``Reporter``: what a run says, put on the publisher off the training thread.

The training thread reads a step's numbers and, once they are all on the host, queues them as a
:class:`FinishedStep` for the step worker (:mod:`publisher.threads.step_worker`). Everything after
that is the reporter's: on the worker's thread it publishes the step's ``metrics`` (with the
``layers`` payload on a sampled step) and then shows the step to the detectors; on the GPU
sampler's thread it does the same with a GPU reading. The detectors' and the invariants' findings
come back as events, each carrying what is needed to reproduce the run up to its step (the
``replay`` record sent once in ``run_start``, docs/protocol.md); the training code's own events
(``Monitor.event``) are published here too, so that every message of a run has one way out.

A failure to publish is counted (:class:`~publisher.telemetry_errors.TelemetryErrors`), never
raised: telemetry must never cost a training run.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from publisher.detectors import Detector, DetectorSet
from publisher.patches.loss_look import LossLook
from publisher.readings import sysinfo
from publisher.readings.batches import BatchPrint
from publisher.readings.identity import describe_model
from publisher.stats.layer_sample import LayerSample, SampleLayout
from publisher.telemetry_errors import TelemetryErrors
from publisher.threads.gpu import GpuSource
from publisher.wire.event_kinds import EVENT_KINDS
from publisher.wire.jsonsafe import json_safe, truncate
from publisher.wire.protocol import SEVERITIES, wire_numbers
from publisher.wire.replay import add_replay, replay_record
from publisher.wire.sidecar_link import SidecarPublisher
from publisher.wire.transport import Publisher
from publisher.wire.validation import MAX_NAME_CHARS

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FinishedStep:
    """A step whose numbers are all on the host, handed by the training thread to the reporter.

    ``grad_norms``: the per-parameter gradient norms, when the step computed them; ``layout``
    reads them and ``arrays`` (the per-layer sample's tensors) into a
    :class:`~publisher.stats.layer_sample.LayerSample`, on a sampled step or one whose gradients
    went bad; ``batches``: the fingerprints of the batches the step consumed; ``looks``: the looks at
    its loss calls (:mod:`publisher.patches.loss_look`).
    """

    step: int
    metrics: dict[str, float]
    grad_norms: torch.Tensor | None
    layout: SampleLayout | None
    arrays: list[torch.Tensor]
    batches: tuple[BatchPrint, ...]
    looks: tuple[LossLook, ...] = ()
    #: The parts that failed on this step (:mod:`publisher.telemetry_errors`), by name.
    failed: tuple[str, ...] = ()


class Reporter:
    """Publishes a run's steps, events and GPU readings and shows them to its detectors.

    ``detectors`` run in the :class:`~publisher.detectors.DetectorSet` the reporter feeds
    (:attr:`detectors`); their findings come back to it as events. ``max_layers``: the parameters
    and modules a published ``layers`` payload lists (the detectors see all).
    ``current_step`` reads the Monitor's latest step, which GPU readings are stamped with.
    """

    def __init__(
        self,
        publisher: Publisher | SidecarPublisher,
        errors: TelemetryErrors,
        detectors: Iterable[Detector],
        *,
        rank: int,
        gpu: GpuSource | None,
        max_layers: int,
        current_step: Callable[[], int],
    ) -> None:
        self.publisher = publisher
        self._errors = errors
        self._gpu = gpu
        self._gpu_simulated = gpu is not None and gpu.simulated
        self._max_layers = max_layers
        self._current_step = current_step
        self._replay: dict[str, Any] = {}
        self._sample = errors.part("per-layer sample")
        self._publishing = errors.part("publishing metrics")
        self.detectors = DetectorSet(detectors, self._emit_event, rank=rank, errors=errors)

    def announce(self, run: str, rank: int, world_size: int, model: torch.nn.Module | None,
                 config: Mapping[str, Any] | None, seed: int | None,
                 monitoring: Mapping[str, Any] | None = None) -> None:
        """Send ``run_start``; keep what every later event carries to reproduce its step.
        ``monitoring``: the Monitor's own options (``tuimon diff`` compares them as it does the
        command line)."""
        repro = sysinfo.reproduction_record(config, seed)
        self.publish(
            "run_start",
            None,
            config=json_safe(dict(config or {})),
            seed=seed,
            argv=list(sys.argv),
            cwd=os.getcwd(),
            pid=os.getpid(),
            world_size=world_size,
            versions=sysinfo.versions(),
            gpu_source=self._gpu.kind if self._gpu else "none",
            repro=repro,
            model=describe_model(model),
            monitoring=json_safe(dict(monitoring or {})),
        )
        self._replay = replay_record(run, rank, seed, repro)

    def publish(self, msg_type: str, step: int | None, **body: Any) -> None:
        """Publish, counting a failure instead of raising it."""
        try:
            self.publisher.publish(msg_type, step=step, **body)
        except Exception as exc:
            self._errors.failed(f"publishing {msg_type}", exc)

    def publish_step(self, finished: FinishedStep) -> None:
        """Publish a step's metrics and sample, then show them to the detectors (worker thread).
        A sample that cannot be read costs the sample only."""
        layout, failed, sample = finished.layout, finished.failed, None
        if layout is not None and self._sample.on:
            try:
                sample = layout.decode(finished.grad_norms, finished.arrays)
            except Exception as exc:
                self._sample.failed(exc, finished.step)
                failed += (self._sample.name,)
        self.publish_metrics(finished.step, finished.metrics, finished.batches, sample, finished.looks,
                             failed)

    def publish_metrics(self, step: int, metrics: dict[str, float], batches: tuple[BatchPrint, ...],
                        sample: LayerSample | None, looks: tuple[LossLook, ...],
                        failed: tuple[str, ...] = ()) -> None:
        """Publish a step's metrics (with its per-layer sample, if any, and the parts that failed on
        it), then show them to the detectors (worker thread; a quiet step's come here straight from
        its tuple). Each part costs only itself: a sample whose totals or payload cannot be made is
        left out, the metrics go out whatever the detectors do."""
        layers = None
        if sample is not None:
            try:
                metrics.update(sample.totals())
                layers = sample.payload(self._max_layers)
            except Exception as exc:
                self._sample.failed(exc, step)
                failed += (self._sample.name,)
                sample = None
        try:
            # One C-level sum tells whether any number is NaN or infinite (the rare case that needs
            # the wire form, which costs a copy).
            wire = metrics if math.isfinite(sum(metrics.values())) else wire_numbers(metrics)
            if layers is None and not failed:  # most steps
                self.publisher.publish("metrics", step=step, metrics=wire)
            else:
                extra: dict[str, Any] = {"failed": list(failed)} if failed else {}
                if layers is not None:
                    extra["layers"] = layers
                self.publisher.publish("metrics", step=step, metrics=wire, **extra)
        except Exception as exc:
            self._publishing.failed(exc, step)
        self.detectors.observe_step(step, metrics, sample, batches, looks)

    def tell_failure(self, severity: str, message: str, step: int | None, details: dict[str, Any]) -> None:
        """A part of the Monitor failed (:mod:`publisher.telemetry_errors`): a ``telemetry_error`` event."""
        self.event("telemetry_error", message, severity, step, details)

    def publish_gpu(self, devices: list[dict[str, Any]]) -> None:
        """Sampler thread: publish the reading, then let the GPU detectors look at it."""
        step = self._current_step() or None
        self.publish("gpu", step, simulated=self._gpu_simulated, devices=json_safe(devices))
        self.detectors.observe_gpu(step, devices, simulated=self._gpu_simulated)

    def event(self, kind: str, message: str, severity: str | None, step: int | None,
              details: dict[str, Any]) -> str:
        """Publish an event of the training code's own (``Monitor.event``); return its id.

        ``severity`` defaults to the kind's (``info`` for unknown kinds). Raises when publishing
        fails: the caller counts it.
        """
        known = EVENT_KINDS.get(kind)
        if severity not in SEVERITIES:
            if severity is not None:
                log.warning("tuimon: unknown severity %r for event %r; using the default", severity, kind)
            severity = known.default_severity if known else "info"
        event_id = self.detectors.tracker.new_id()
        self.publisher.publish(
            "event",
            step=step,
            id=event_id,
            severity=severity,
            kind=truncate(str(kind), MAX_NAME_CHARS),
            message=truncate(str(message)),
            details=json_safe(details),
            count=1,
        )
        return event_id

    def _emit_event(self, step: int | None, body: dict[str, Any]) -> None:
        """An episode's event (detectors, invariants): it carries the step, the rank and what is
        needed to reproduce the run up to it."""
        add_replay(body, self._replay, step)
        self.publish("event", step, **body)
