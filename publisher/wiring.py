"""``MonitorParts``: the collaborators of a :class:`~publisher.monitor.Monitor`, built in order.

A Monitor is a thin façade over the training thread's reads (:mod:`publisher.monitor`); what it
feeds is built here: the publisher (its own process: socket, recording, registry), the GPU source
and its sampler thread, the reporter and its detectors (:mod:`publisher.reporter`, which publishes
what the run says), the step worker thread and what it completes each step with (:mod:`publisher.completion`),
the layer sampler, the invariant checker and the hang watchdog
(whose readings ride on the publisher's heartbeats, and whose verdicts become events:
:mod:`publisher.detectors.stall_events`). Building them is order-sensitive
(``run_start`` goes out before the invariant checker announces its first statuses, a failed bind
must release the GPU source), so the order is written once, here, and so is the order of closing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from publisher.completion import StepCompletion
from publisher.detectors import Detector, default_detectors
from publisher.detectors.published import split_defaults
from publisher.detectors.stall_events import StallEvents
from publisher.invariants import InvariantConfig
from publisher.invariants.link import InvariantLink
from publisher.readings.compute_time import ComputeTimer
from publisher.readings.identity import local_rank
from publisher.readings.memory import MemoryReader
from publisher.readings.params import TrainedParams
from publisher.readings.step import QuietStep, StepReadings
from publisher.readings.timing import StepTimer
from publisher.reporter import Reporter
from publisher.stats.sampler import LayerSampler, StatsConfig
from publisher.telemetry_errors import TelemetryErrors
from publisher.threads.gpu import GpuSampler, GpuSource, SimulatedSource, open_gpu_source
from publisher.threads.step_worker import StepWorker
from publisher.threads.watchdog import HangWatchdog
from publisher.wire.sidecar_link import SidecarPublisher, SidecarUnavailable
from publisher.wire.transport import Publisher

log = logging.getLogger(__name__)


def _publisher(run: str, rank: int, endpoint: str | None, record: str | os.PathLike[str] | None,
               heartbeat_extra: Callable[[], Mapping[str, Any]],
               detectors: list[str]) -> SidecarPublisher | Publisher:
    """The run's publisher, in a process of its own (:mod:`publisher.wire.sidecar`: its Python off
    the training process's GIL) that runs the ``detectors`` named; where that process cannot start
    (an embedded or frozen Python without an interpreter to run), on a thread of this process, said
    once. The publisher's own errors (an unusable endpoint, an unwritable recording) are raised
    either way."""
    try:
        return SidecarPublisher(run, rank, endpoint=endpoint, record=record, heartbeat_extra=heartbeat_extra,
                                detectors=detectors)
    except SidecarUnavailable as exc:
        log.warning("tuimon: %s; publishing from a thread of the training process instead", exc)
        return Publisher(run, rank, endpoint=endpoint, record=record, heartbeat_extra=heartbeat_extra)


class MonitorParts:
    """Builds and holds a Monitor's collaborators; raises on arguments a user must fix.

    ``current_step`` reads the Monitor's latest step (GPU readings are stamped with it).
    """

    def __init__(
        self,
        *,
        run: str,
        rank: int,
        world_size: int,
        params: TrainedParams,
        timer: StepTimer,
        compute: ComputeTimer,
        memory: MemoryReader,
        errors: TelemetryErrors,
        current_step: Callable[[], int],
        config: Mapping[str, Any] | None,
        seed: int | None,
        endpoint: str | None,
        record: str | os.PathLike[str] | None,
        gpu: str,
        gpu_interval: float,
        detectors: bool | Iterable[Detector],
        stats: StatsConfig | None,
        invariants: InvariantConfig | None,
        hang_after_s: float | None = None,
        monitoring: Mapping[str, Any] | None = None,
    ) -> None:
        # Checks its setting; its thread starts once everything else is built.
        self.watchdog = HangWatchdog(timer, after_s=hang_after_s, world_size=world_size,
                                     on_error=errors.failed)
        # GPUs are the node's: only local rank 0 reads them.
        self.gpu_source: GpuSource | None = open_gpu_source(gpu) if local_rank() == 0 else None
        # The default suite's detectors of published metrics run in the publisher's process.
        chosen = default_detectors() if detectors is True else list(detectors or ())
        here, there = split_defaults(chosen) if detectors is True else (chosen, [])
        try:
            self.publisher = _publisher(run, rank, endpoint, record, self.watchdog.heartbeat_fields, there)
        except BaseException:
            if self.gpu_source is not None:
                self.gpu_source.close()
            raise
        if not isinstance(self.publisher, SidecarPublisher):
            here = chosen
        self.reporter = Reporter(
            self.publisher, errors, here,
            rank=rank, gpu=self.gpu_source, max_layers=stats.max_published if stats is not None else 0,
            current_step=current_step,
        )
        if isinstance(self.publisher, SidecarPublisher) and there:
            self.reporter.detectors.context.on_update = self.publisher.share_context
        self.completion = StepCompletion(timer, compute, memory, lambda: self.watchdog.thread_id, errors)
        self.worker: StepWorker[StepReadings | QuietStep] = StepWorker(self._finish_step,
                                                                       self.publisher.count_drop)
        self.reporter.announce(run, rank, world_size, params.model, config, seed, monitoring)
        errors.report_to(self.reporter.tell_failure)  # after run_start: a viewer knows the run
        watched = params.model is not None or bool(params.optimizers)
        self.layers: LayerSampler | None = None
        if stats is not None and watched:
            self.layers = LayerSampler(stats, params.model, params.optimizers, params.current, errors)
            self.completion.layers = self.layers
        self.invariants: InvariantLink | None = None
        if invariants is not None and watched:
            self.invariants = InvariantLink(
                params.optimizers, params.model, publish=self.reporter.publish,
                tracker=self.reporter.detectors.tracker, rank=rank, config=invariants,
                steps_done=current_step(), step_clock=timer.clock,
            )
        self.sampler: GpuSampler | None = None
        if self.gpu_source is not None:
            if isinstance(self.gpu_source, SimulatedSource):
                self.gpu_source.follow(timer.busy)
            self.sampler = GpuSampler(self.gpu_source, self.reporter.publish_gpu, gpu_interval).start()
        self.stalls = StallEvents(self.reporter.detectors.tracker, rank=rank, world_size=world_size,
                                  current_step=current_step)
        self.watchdog.start(self.stalls)

    def _finish_step(self, item: StepReadings | QuietStep) -> None:
        """Step worker thread: complete a step the training thread queued, then publish it (each
        part of completing it fails alone: the step goes out)."""
        if type(item) is tuple:  # a quiet step (most of them)
            metrics, looks, failed = self.completion.complete_quiet(item)
            self.reporter.publish_metrics(item[0], metrics, item[9], None, looks, failed)
            return
        assert isinstance(item, StepReadings)
        self.reporter.publish_step(self.completion.complete(item))

    def closers(self, status: str, error: str | None) -> list[Callable[[], None]]:
        """What closing does, in order: stop the hang watchdog (closing is no stall), settle the
        invariants' verdicts in flight, stop sampling, publish the steps still queued (the
        detectors see them), close what completing them kept open, send held-back event counts,
        then ``run_end``."""
        return [
            action for action in (
                self.watchdog.stop,
                self.invariants.close if self.invariants else None,
                self.layers.close if self.layers else None,
                self.sampler.stop if self.sampler else None,
                self.gpu_source.close if self.gpu_source else None,
                self.worker.close,
                self.completion.close,
                self.reporter.detectors.close,
                lambda: self.publisher.close(status=status, error=error),
            ) if action is not None
        ]
