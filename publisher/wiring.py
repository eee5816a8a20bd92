"""The collaborators of a :class:`~publisher.monitor.Monitor`, built in order, and the glue between them.

A Monitor is a thin façade over the training thread's reads (:mod:`publisher.monitor`); everything
it feeds lives here: the publisher (socket, recording, registry), the GPU source and its sampler
thread, the detectors and their episodes, the step worker thread, the layer sampler, the
invariant checker and the hang watchdog (whose findings ride on the publisher's heartbeats).
Building them is order-sensitive (``run_start`` goes out before the invariant checker announces
its first statuses, a failed bind must release the GPU source), so the order is written once, here.

The glue runs off the training thread: :meth:`MonitorParts.publish_step` on the step worker's,
:meth:`MonitorParts.on_gpu_sample` on the GPU sampler's. Failures of monitoring are counted by a
:class:`TelemetryErrors` and logged once: telemetry must never cost a training run.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from publisher.collect import sysinfo
from publisher.collect.batches import BatchPrint
from publisher.collect.gpu import GpuSampler, GpuSource, SimulatedSource, open_gpu_source
from publisher.collect.identity import describe_model, local_rank
from publisher.collect.params import TrainedParams
from publisher.collect.step_worker import StepWorker
from publisher.collect.timing import StepTimer
from publisher.collect.watchdog import HangWatchdog
from publisher.detectors import Detector, DetectorSet, default_detectors
from publisher.invariants import InvariantConfig
from publisher.invariants.link import InvariantLink
from publisher.stats.layer_sample import LayerSample, SampleLayout
from publisher.stats.sampler import LayerSampler, StatsConfig
from publisher.wire.jsonsafe import json_safe
from publisher.wire.protocol import wire_numbers
from publisher.wire.transport import Publisher

log = logging.getLogger(__name__)

#: A step whose numbers are on the host, queued for the worker: (step, metrics, per-parameter
#: gradient norms, sample layout, the sample's arrays, the fingerprints of its batches).
FinishedStep = tuple[
    int, dict[str, float], torch.Tensor | None, SampleLayout | None, list[torch.Tensor],
    tuple[BatchPrint, ...],
]


class TelemetryErrors:
    """Failures of monitoring itself: counted, the first one logged, none ever raised into training."""

    def __init__(self) -> None:
        self.count = 0

    def failed(self, what: str, exc: BaseException) -> None:
        self.count += 1
        if self.count == 1:
            log.warning(
                "tuimon: %s failed (%s: %s); training continues, further telemetry errors are only counted",
                what,
                type(exc).__name__,
                exc,
            )


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
    ) -> None:
        self._errors = errors
        self._current_step = current_step
        # Checks its setting; its thread starts once everything else is built.
        self.watchdog = HangWatchdog(timer, after_s=hang_after_s, on_error=errors.failed)
        # GPUs are the node's: only local rank 0 reads them.
        self.gpu_source: GpuSource | None = open_gpu_source(gpu) if local_rank() == 0 else None
        try:
            self.publisher = Publisher(run, rank, endpoint=endpoint, record=record,
                                       heartbeat_extra=self.watchdog.heartbeat_fields)
        except BaseException:
            if self.gpu_source is not None:
                self.gpu_source.close()
            raise
        chosen = default_detectors() if detectors is True else list(detectors or ())
        self.detectors = DetectorSet(chosen, self.emit_event, rank=rank)
        self.worker: StepWorker[FinishedStep] = StepWorker(self.publish_step, self.publisher.count_drop)
        self._replay = self._announce(run, rank, world_size, params.model, config, seed)
        watched = params.model is not None or bool(params.optimizers)
        self.layers: LayerSampler | None = None
        if stats is not None and watched:
            self.layers = LayerSampler(stats, params.model, params.optimizers, params.current)
        self.invariants: InvariantLink | None = None
        if invariants is not None and watched:
            self.invariants = InvariantLink(
                params.optimizers, params.model, publish=self.publish, tracker=self.detectors.tracker,
                rank=rank, config=invariants, steps_done=current_step(), step_clock=timer.clock,
            )
        self.sampler: GpuSampler | None = None
        self._gpu_simulated = self.gpu_source is not None and self.gpu_source.simulated
        if self.gpu_source is not None:
            if isinstance(self.gpu_source, SimulatedSource):
                self.gpu_source.follow(timer.busy)
            self.sampler = GpuSampler(self.gpu_source, self.on_gpu_sample, gpu_interval).start()
        self.watchdog.start()

    def _announce(self, run: str, rank: int, world_size: int, model: torch.nn.Module | None,
                  config: Mapping[str, Any] | None, seed: int | None) -> dict[str, Any]:
        """Send ``run_start``; return what every event carries to reproduce its step (docs/protocol.md)."""
        if seed is None:
            seed = sysinfo.torch_seed()
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
            gpu_source=self.gpu_source.kind if self.gpu_source else "none",
            repro=repro,
            model=describe_model(model),
        )
        return json_safe({
            "run": run, "rank": rank, "seed": seed, "torch_seed": repro["torch_seed"],
            "config_hash": repro["config_hash"], "git": repro["git"], "argv": repro["argv"],
        })

    # -- glue (off the training thread) -----------------------------------------------------------

    def publish(self, msg_type: str, step: int | None, **body: Any) -> None:
        """Publish, counting a failure instead of raising it."""
        try:
            self.publisher.publish(msg_type, step=step, **body)
        except Exception as exc:
            self._errors.failed(f"publishing {msg_type}", exc)

    def emit_event(self, step: int | None, body: dict[str, Any]) -> None:
        """Every event carries the step, rank and what is needed to reproduce the run up to it."""
        body["details"] = {**body["details"], "replay": {**self._replay, "step": step}}
        self.publish("event", step, **body)

    def publish_step(self, finished: FinishedStep) -> None:
        """Publish a step's metrics and sample, then show them to the detectors (worker thread)."""
        try:
            self._publish_finished(*finished)
        except Exception as exc:
            self._errors.failed(f"metrics of step {finished[0]}", exc)

    def _publish_finished(self, step: int, metrics: dict[str, float], grad_norms: torch.Tensor | None,
                          layout: SampleLayout | None, arrays: list[torch.Tensor],
                          batches: tuple[BatchPrint, ...]) -> None:
        sample: LayerSample | None = layout.decode(grad_norms, arrays) if layout is not None else None
        if sample is not None:
            metrics.update(sample.totals())
        # One C-level sum tells whether any number is NaN or infinite (the rare case that needs the
        # wire form, which costs a copy).
        wire = metrics if math.isfinite(sum(metrics.values())) else wire_numbers(metrics)
        if sample is None:
            self.publisher.publish("metrics", step=step, metrics=wire)
        else:
            limit = self.layers.config.max_published if self.layers else 0
            self.publisher.publish("metrics", step=step, metrics=wire, layers=sample.payload(limit))
        self.detectors.observe_step(step, metrics, sample, batches)

    def on_gpu_sample(self, devices: list[dict[str, Any]]) -> None:
        """Sampler thread: publish the reading, then let the GPU detectors look at it."""
        step = self._current_step() or None
        self.publish("gpu", step, simulated=self._gpu_simulated, devices=json_safe(devices))
        self.detectors.observe_gpu(step, devices, simulated=self._gpu_simulated)

    def closers(self, status: str, error: str | None) -> list[Callable[[], None]]:
        """What closing does, in order: stop the hang watchdog (closing is no stall), settle the
        invariants' verdicts in flight, stop sampling, publish the steps still queued (the
        detectors see them), send held-back event counts, then ``run_end``."""
        return [
            action for action in (
                self.watchdog.stop,
                self.invariants.close if self.invariants else None,
                self.layers.close if self.layers else None,
                self.sampler.stop if self.sampler else None,
                self.gpu_source.close if self.gpu_source else None,
                self.worker.close,
                self.detectors.close,
                lambda: self.publisher.close(status=status, error=error),
            ) if action is not None
        ]
