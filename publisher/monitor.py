"""``Monitor``: the few lines a PyTorch training loop adds to be watched live by tuimon.

    mon = Monitor(model, optimizer, run="exp1", config=cfg, record="run.jsonl")
    for batch in mon.track_data(loader):      # optional: measures data_time
        loss = ...; loss.backward(); optimizer.step()
        mon.step(loss, tokens=n_tokens, samples=batch_size)
        optimizer.zero_grad()
    mon.close()                               # or: with Monitor(...) as mon: ...

The training thread only reads a few numbers and queues a few device operations per step;
assembling, publishing and the detectors run on the step worker's thread
(:mod:`publisher.step_worker`), encoding, sending and recording on the publisher's, GPU polling on
the sampler's. On CUDA the step's numbers reach the host through one asynchronous copy
(:mod:`publisher.fetch`): no host-device synchronisation per step. Every few steps a per-layer
sample (:mod:`publisher.tensorstats`) rides along; the training invariants
(:mod:`publisher.invariants`) watch the optimizers through their hooks. Telemetry must never cost
a run: after construction, nothing here raises because of monitoring (errors are counted in
:attr:`Monitor.telemetry_errors` and logged once).
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

import torch

from publisher import sysinfo
from publisher.budget import CostBudget, StepClock
from publisher.detectors import Detector, DetectorSet, default_detectors
from publisher.event_kinds import EVENT_KINDS
from publisher.fetch import DeviceFetch
from publisher.gpu import GpuSampler, GpuSource, SimulatedSource, open_gpu_source
from publisher.invariant_link import InvariantLink
from publisher.invariants import InvariantConfig
from publisher.jsonsafe import json_safe
from publisher.layer_sample import LayerSample, SampleLayout
from publisher.memory import DEFAULT_INTERVAL_S, MemoryReader
from publisher.protocol import RUN_END_STATUSES, SEVERITIES, wire_numbers
from publisher.step_worker import StepWorker
from publisher.tensorstats import GradNormer, GradNorms, LayerSampler, StatsConfig
from publisher.transport import Publisher, end_status

log = logging.getLogger(__name__)

T = TypeVar("T")
#: A step whose numbers are on the host, queued for the worker: (step, metrics, per-parameter
#: gradient norms, sample layout, the sample's arrays).
_FinishedStep = tuple[int, dict[str, float], torch.Tensor | None, SampleLayout | None, list[torch.Tensor]]

#: Share of the step time the gradient norm may cost on average. Computing it reads every
#: gradient once: negligible on a GPU, but on a CPU a 2M-parameter model pays ~1 ms, 5 % of a
#: 20 ms step; it is then computed every few steps to stay within this budget.
GRAD_NORM_BUDGET = 0.005


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _distributed() -> Any:
    """``torch.distributed`` when a process group is up, else None."""
    dist = torch.distributed
    return dist if dist.is_available() and dist.is_initialized() else None


def default_rank() -> int:
    """``$RANK``, else the torch.distributed rank once a process group is up, else 0."""
    rank = _env_int("RANK")
    if rank is not None:
        return rank
    dist = _distributed()
    return dist.get_rank() if dist else 0


def _default_world_size() -> int:
    size = _env_int("WORLD_SIZE")
    if size is not None:
        return size
    dist = _distributed()
    return dist.get_world_size() if dist else 1


def _default_run_name() -> str:
    """``$TUIMON_RUN``, else a timestamp (set TUIMON_RUN so that all ranks share one name)."""
    return os.environ.get("TUIMON_RUN") or time.strftime("run-%Y%m%d-%H%M%S")


def _describe_model(model: torch.nn.Module | None) -> dict[str, Any] | None:
    if model is None:
        return None
    params = list(model.parameters())
    return {
        "class": type(model).__name__,
        "parameters": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in params if p.requires_grad),
    }


class Monitor:
    """Collects a run's metrics, GPU readings, anomaly events and invariants and publishes them for tuimon.

    Construction sends ``run_start`` (config, seed, command, versions, reproduction record) and
    starts GPU sampling; it raises on bad arguments (an unusable ``endpoint``, ``gpu="nvml"``
    without a driver, an invalid configuration) because that is the moment a user can fix them.

    ``gpu``: ``"auto"`` (NVML when there is a driver, else off, said once), ``"nvml"``,
    ``"simulated"`` (a demo source, marked simulated everywhere) or ``"none"``. GPUs are the
    node's, so only local rank 0 (``$LOCAL_RANK``, default 0) samples them.
    ``detectors``: True for :func:`~publisher.detectors.default_detectors`, False for none, or
    your own list of :class:`~publisher.findings.Detector`.
    ``grad_norm_budget``: the share of step time the gradient norm may cost on average (default
    0.5 %; 1.0 computes it on every step whatever it costs).
    ``stats``: per-layer samples (gradient and weight norms, update ratios, module output
    statistics): True for the defaults of :class:`~publisher.tensorstats.StatsConfig`, a
    ``StatsConfig``, or False.
    ``invariants``: the training invariants (:mod:`publisher.invariants`): True for the defaults,
    an :class:`~publisher.invariants.InvariantConfig`, or False. They need the optimizer(s).
    ``memory_interval_s``: how often host and CUDA memory are read (0: every step).
    """

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        run: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        config: Mapping[str, Any] | None = None,
        seed: int | None = None,
        endpoint: str | None = None,
        record: str | os.PathLike[str] | None = None,
        gpu: str = "auto",
        gpu_interval: float = 1.0,
        detectors: bool | Iterable[Detector] = True,
        grad_norm_budget: float = GRAD_NORM_BUDGET,
        stats: bool | StatsConfig = True,
        invariants: bool | InvariantConfig = True,
        memory_interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        stats_config = StatsConfig() if stats is True else stats or None
        invariant_config = InvariantConfig() if invariants is True else invariants or None
        self._memory = MemoryReader(memory_interval_s, self._param_device)  # validates before binding
        self.run = run or _default_run_name()
        self.rank = default_rank() if rank is None else rank
        self.world_size = _default_world_size() if world_size is None else world_size
        self.telemetry_errors = 0
        self._closed = False
        self._pid = os.getpid()
        self._optimizer = optimizer  # the primary one: its lr is the run's lr
        self._optimizers = [optimizer] if optimizer is not None else []
        self._model = model
        self._params = self._trained_params()
        self._n_groups = sum(len(opt.param_groups) for opt in self._optimizers)
        self._grad_normer = GradNormer()
        self._grad_norm_budget = CostBudget(grad_norm_budget, what="grad_norm_budget")
        self._grad_norm_wait = 0  # steps to skip before the next computation
        self._clock = StepClock()
        self._fetch = DeviceFetch()
        self._step = 0
        self._last_step_at: float | None = None
        self._last_step_time = 0.0
        self._pending_data_time: float | None = None

        local_rank = _env_int("LOCAL_RANK") or 0
        self.gpu_source: GpuSource | None = open_gpu_source(gpu) if local_rank == 0 else None
        try:
            self.publisher = Publisher(self.run, self.rank, endpoint=endpoint, record=record)
        except BaseException:
            if self.gpu_source is not None:
                self.gpu_source.close()
            raise
        chosen = default_detectors() if detectors is True else list(detectors or ())
        self._detectors = DetectorSet(chosen, self._emit_event, rank=self.rank)
        self._worker: StepWorker[_FinishedStep] = StepWorker(self._publish_step, self.publisher.count_drop)

        if seed is None:
            seed = sysinfo.torch_seed()
        repro = sysinfo.reproduction_record(config, seed)
        #: What every event carries so that its step can be reproduced (docs/protocol.md).
        self._replay = json_safe({
            "run": self.run, "rank": self.rank, "seed": seed, "torch_seed": repro["torch_seed"],
            "config_hash": repro["config_hash"], "git": repro["git"], "argv": repro["argv"],
        })
        self._publish(
            "run_start",
            None,
            config=json_safe(dict(config or {})),
            seed=seed,
            argv=list(sys.argv),
            cwd=os.getcwd(),
            pid=os.getpid(),
            world_size=self.world_size,
            versions=sysinfo.versions(),
            gpu_source=self.gpu_source.kind if self.gpu_source else "none",
            repro=repro,
            model=_describe_model(model),
        )
        self._layers: LayerSampler | None = None
        if stats_config is not None and (model is not None or self._optimizers):
            self._layers = LayerSampler(stats_config, model, self._optimizers, self._current_params)
        self._invariants: InvariantLink | None = None
        if invariant_config is not None and (model is not None or self._optimizers):
            self._invariants = InvariantLink(
                self._optimizers, model, publish=self._publish, tracker=self._detectors.tracker,
                rank=self.rank, config=invariant_config, steps_done=self._step, step_clock=self._clock,
            )
        self._sampler: GpuSampler | None = None
        self._gpu_simulated = self.gpu_source is not None and self.gpu_source.simulated
        if self.gpu_source is not None:
            if isinstance(self.gpu_source, SimulatedSource):
                self.gpu_source.follow(self._training_load)
            self._sampler = GpuSampler(self.gpu_source, self._on_gpu_sample, gpu_interval).start()
        atexit.register(self._close_at_exit)

    # -- the hot path ---------------------------------------------------------------------------

    def step(
        self,
        loss: torch.Tensor | float | None,
        *,
        tokens: int | None = None,
        samples: int | None = None,
        data_time: float | None = None,
        step: int | None = None,
        **extra: Any,
    ) -> None:
        """Record one optimizer step: call it after ``optimizer.step()``, before ``zero_grad()``.

        Publishes ``loss``, ``lr`` (``lr/1``... for further param groups), ``grad_norm`` (global
        L2 norm of the ``.grad`` the optimizer just used, i.e. after any clipping; pass
        ``grad_norm=`` yourself to report the pre-clip value ``clip_grad_norm_`` returns; where
        computing it would cost more than ``grad_norm_budget`` of the step, as for big models on
        a CPU, it is computed every few steps only),
        ``step_time`` and throughput since the previous call, ``data_time`` (given, or measured
        by :meth:`track_data`), memory (``host_mem_bytes``, ``cuda_mem_*``, every
        ``memory_interval_s``), on sampled steps ``param_norm``, ``update_ratio`` and the
        per-layer ``layers`` payload, and any numeric ``extra`` (an extra with a standard name,
        such as ``grad_norm=`` or ``lr=``, replaces the computed one).
        ``step`` defaults to the previous step + 1 (the first call is step 1).

        Host-device syncs on CUDA: none. The loss, the gradient norms, tensor extras and sampled
        statistics are copied to the host together, asynchronously; the step's ``metrics``
        message is published once they have arrived, usually during one of the next calls (at
        the latest at :meth:`close`). Nothing here raises because of telemetry.
        """
        try:
            self._record_step(loss, tokens, samples, data_time, step, extra)
        except Exception as exc:
            self._telemetry_failed("step()", exc)

    def _record_step(
        self,
        loss: torch.Tensor | float | None,
        tokens: int | None,
        samples: int | None,
        data_time: float | None,
        step: int | None,
        extra: dict[str, Any],
    ) -> None:
        now = time.perf_counter()
        step = self._step + 1 if step is None else int(step)
        self._step = step
        layers = self._layers
        sampling = layers is not None and layers.sampling
        metrics: dict[str, float] = {}
        # Scalars on an accelerator are fetched later, all together; CPU ones are read now (free).
        waiting: list[tuple[str, torch.Tensor]] = []
        if isinstance(loss, torch.Tensor):
            if loss.numel() != 1:
                raise ValueError(f"the loss must be one number, got a tensor of shape {tuple(loss.shape)}")
            self._read("loss", loss, metrics, waiting)
        elif loss is not None:
            metrics["loss"] = float(loss)
        grads = None
        if "grad_norm" not in extra and self._params:
            try:
                grads = self._grad_normer(self._current_params()) if sampling else self._budgeted_grad_norm()
            except Exception as exc:  # a broken measurement costs itself, not the step's metrics
                self._telemetry_failed("gradient norm", exc)
            if grads is not None:
                self._read("grad_norm", grads.total, metrics, waiting)
        optimizer = self._optimizer
        if optimizer is not None:
            for i, group in enumerate(optimizer.param_groups):
                lr = group["lr"]
                name = f"lr/{i}" if i else "lr"
                if isinstance(lr, torch.Tensor):  # capturable optimizers keep it on the device
                    self._read(name, lr, metrics, waiting)
                else:
                    metrics[name] = float(lr)
        previous = self._last_step_at
        self._last_step_at = now
        if previous is not None:
            elapsed = now - previous
            self._last_step_time = elapsed
            self._clock.observe(elapsed)
            metrics["step_time"] = elapsed
            if elapsed > 0:
                if samples:
                    metrics["samples_per_s"] = float(samples) / elapsed
                if tokens:
                    metrics["tokens_per_s"] = float(tokens) / elapsed
        if data_time is None:
            data_time, self._pending_data_time = self._pending_data_time, None
        if data_time is not None:
            metrics["data_time"] = float(data_time)
        if now >= self._memory.next_at:
            metrics.update(self._memory.read(now))
        for name, value in extra.items():
            try:
                if isinstance(value, torch.Tensor) and value.numel() == 1:
                    self._read(name, value, metrics, waiting)
                else:
                    metrics[name] = float(value)
            except (TypeError, ValueError, RuntimeError) as exc:
                self._telemetry_failed(f"metric {name!r}", exc)
        # Per-parameter gradient norms, then the sample's tensors: read only when needed, on arrival.
        arrays = [grads.norms] if grads is not None else []
        layout = None
        if sampling:
            assert layers is not None
            try:
                parts, layout = layers.collect(grads)
                arrays += parts
            except Exception as exc:
                self._telemetry_failed("per-layer sample", exc)
        # Arrays live where the parameters do: the first one tells.
        if waiting or self._fetch.queue or (arrays and not arrays[0].is_cpu):
            names = [name for name, _ in waiting]
            self._fetch.submit([t for _, t in waiting] + arrays,
                               partial(self._arrived, step, metrics, names, grads, layout))
        else:
            self._hand_over(step, metrics, grads, layout, arrays)
        if layers is not None:
            layers.advance(self._clock.seconds)
        if self._invariants is not None:
            self._invariants.sync(step)

    @staticmethod
    def _read(name: str, value: torch.Tensor, metrics: dict[str, float], waiting: list) -> None:
        """A one-element tensor: its number now if it is on the CPU, else queued for the fetch."""
        if value.is_cpu:
            metrics[name] = value.item()
        else:
            waiting.append((name, value))

    def _arrived(
        self,
        step: int,
        metrics: dict[str, float],
        names: list[str],
        grads: GradNorms | None,
        layout: SampleLayout | None,
        values: list[torch.Tensor],
    ) -> None:
        """A step's device numbers are on the host (a later step, or close()): complete the step."""
        try:
            for name, value in zip(names, values, strict=False):
                metrics[name] = value.item()
            self._hand_over(step, metrics, grads, layout, values[len(names):])
        except Exception as exc:
            self._telemetry_failed(f"metrics of step {step}", exc)

    def _hand_over(
        self,
        step: int,
        metrics: dict[str, float],
        grads: GradNorms | None,
        layout: SampleLayout | None,
        arrays: list[torch.Tensor],
    ) -> None:
        """A step's numbers are all on the host: queue it for the worker (training thread)."""
        grad_norms = arrays[0] if grads is not None else None
        if layout is None and grad_norms is not None and self._layers is not None and not math.isfinite(
                metrics["grad_norm"]):
            # Not a sampled step, but the gradients went bad: say which ones.
            layout = self._layers.gradient_layout(grads)
            arrays = [grad_norms]
        self._worker.submit((step, metrics, grad_norms, layout, arrays[0 if grad_norms is None else 1:]))

    def _publish_step(self, finished: _FinishedStep) -> None:
        """Publish a step's metrics and sample, then show them to the detectors (worker thread)."""
        try:
            self._publish_finished(*finished)
        except Exception as exc:
            self._telemetry_failed(f"metrics of step {finished[0]}", exc)

    def _publish_finished(self, step: int, metrics: dict[str, float], grad_norms: torch.Tensor | None,
                          layout: SampleLayout | None, arrays: list[torch.Tensor]) -> None:
        sample: LayerSample | None = layout.decode(grad_norms, arrays) if layout is not None else None
        if sample is not None:
            metrics.update(sample.totals())
        # One C-level sum tells whether any number is NaN or infinite (the rare case that needs the
        # wire form, which costs a copy).
        wire = metrics if math.isfinite(sum(metrics.values())) else wire_numbers(metrics)
        if sample is None:
            self.publisher.publish("metrics", step=step, metrics=wire)
        else:
            limit = self._layers.config.max_published if self._layers else 0
            self.publisher.publish("metrics", step=step, metrics=wire, layers=sample.payload(limit))
        self._detectors.observe_step(step, metrics, sample)

    def _budgeted_grad_norm(self) -> GradNorms | None:
        """The gradient norms on as many steps as ``grad_norm_budget`` allows, None on the others.

        Their cost on this thread is measured each time (:class:`~publisher.budget.CostBudget`).
        On a GPU the kernels are only queued here, so the cost is a few microseconds and the norm
        is there on every step.
        """
        if self._grad_norm_wait > 0:
            self._grad_norm_wait -= 1
            return None
        started = time.perf_counter()
        norms = self._grad_normer(self._current_params())
        budget = self._grad_norm_budget
        budget.charge(time.perf_counter() - started)
        self._grad_norm_wait = budget.gap(self._clock.seconds) - 1
        return norms

    def _current_params(self) -> list[torch.Tensor]:
        """The trained parameters, re-read when ``add_param_group()`` changed an optimizer."""
        n_groups = sum(len(optimizer.param_groups) for optimizer in self._optimizers)
        if n_groups != self._n_groups:
            self._n_groups = n_groups
            self._params = self._trained_params()
        return self._params

    def _param_device(self) -> torch.device | None:
        return self._params[0].device if self._params else None

    def _trained_params(self) -> list[torch.Tensor]:
        if self._optimizers:
            groups = [group for opt in self._optimizers for group in opt.param_groups]
            return list({id(p): p for group in groups for p in group["params"]}.values())
        if self._model is not None:
            return [p for p in self._model.parameters() if p.requires_grad]
        return []

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Watch one more optimizer (a GAN's second one): its parameters join the gradient norm,
        the per-layer samples and the invariants.

        The first optimizer stays the primary one, whose learning rate is reported as ``lr``.
        """
        if any(optimizer is known for known in self._optimizers):
            return
        self._optimizers.append(optimizer)
        if self._optimizer is None:
            self._optimizer = optimizer
        self._params = self._trained_params()
        self._n_groups = sum(len(opt.param_groups) for opt in self._optimizers)
        try:
            if self._layers is not None:
                self._layers.add_optimizer(optimizer)
            if self._invariants is not None:
                self._invariants.add_optimizer(optimizer)
        except Exception as exc:
            self._telemetry_failed("add_optimizer()", exc)

    def track_data(self, iterable: Iterable[T]) -> Iterator[T]:
        """Iterate ``iterable``, timing each fetch; the next :meth:`step` reports it as ``data_time``."""
        iterator = iter(iterable)
        while True:
            started = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                return
            self._pending_data_time = time.perf_counter() - started
            yield item

    # -- events, GPUs ---------------------------------------------------------------------------

    def event(
        self,
        kind: str,
        message: str,
        *,
        severity: str | None = None,
        step: int | None = None,
        **details: Any,
    ) -> str | None:
        """Publish an event from training code (a known ``EVENT_KINDS`` name or your own kind).

        ``severity`` defaults to the kind's (``info`` for unknown kinds); ``step`` to the latest
        step. Returns the event's id, or None if it could not be published.
        """
        try:
            known = EVENT_KINDS.get(kind)
            if severity not in SEVERITIES:
                if severity is not None:
                    log.warning("tuimon: unknown severity %r for event %r; using the default", severity, kind)
                severity = known.default_severity if known else "info"
            event_id = self._detectors.tracker.new_id()
            self.publisher.publish(
                "event",
                step=(self._step or None) if step is None else step,
                id=event_id,
                severity=severity,
                kind=str(kind),
                message=str(message),
                details=json_safe(details),
                count=1,
            )
            return event_id
        except Exception as exc:
            self._telemetry_failed("event()", exc)
            return None

    def _emit_event(self, step: int | None, body: dict[str, Any]) -> None:
        """Every event carries the step, rank and what is needed to reproduce the run up to it."""
        body["details"] = {**body["details"], "replay": {**self._replay, "step": step}}
        self._publish("event", step, **body)

    def _on_gpu_sample(self, devices: list[dict[str, Any]]) -> None:
        """Sampler thread: publish the reading, then let the GPU detectors look at it."""
        step = self._step or None
        self._publish("gpu", step, simulated=self._gpu_simulated, devices=json_safe(devices))
        self._detectors.observe_gpu(step, devices, simulated=self._gpu_simulated)

    def _training_load(self) -> float:
        """1.0 while steps keep coming (a simulated GPU is then busy), 0.0 once they stop."""
        last = self._last_step_at
        if last is None or self._closed:
            return 0.0
        idle_after = max(2.0, 3.0 * self._last_step_time)
        return 1.0 if time.perf_counter() - last < idle_after else 0.0

    # -- plumbing -------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """Address of the ZeroMQ PUB socket a viewer connects to."""
        return self.publisher.endpoint

    @property
    def current_step(self) -> int:
        """The last step recorded (0 before the first :meth:`step`)."""
        return self._step

    def _publish(self, msg_type: str, step: int | None, **body: Any) -> None:
        try:
            self.publisher.publish(msg_type, step=step, **body)
        except Exception as exc:
            self._telemetry_failed(f"publishing {msg_type}", exc)

    def _telemetry_failed(self, what: str, exc: BaseException) -> None:
        self.telemetry_errors += 1
        if self.telemetry_errors == 1:
            log.warning(
                "tuimon: %s failed (%s: %s); training continues, further telemetry errors are only counted",
                what,
                type(exc).__name__,
                exc,
            )

    def close(self, status: str = "completed", error: str | None = None) -> None:
        """Publish what is still on its way, settle the invariants, stop GPU sampling, send held-back
        event updates, then ``run_end``; idempotent.

        Raises only for a ``status`` that is not one of the protocol's (a bug in the caller).
        """
        if status not in RUN_END_STATUSES:
            raise ValueError(f"status must be one of {RUN_END_STATUSES}, got {status!r}")
        if self._closed or os.getpid() != self._pid:  # a forked child (DataLoader worker) owns nothing
            return
        self._closed = True
        atexit.unregister(self._close_at_exit)
        steps = (
            partial(self._fetch.drain, wait=True),  # the last steps' metrics, still on the device
            (self._invariants.close if self._invariants else None),  # settles verdicts in flight
            (self._layers.close if self._layers else None),
            (self._sampler.stop if self._sampler else None),
            (self.gpu_source.close if self.gpu_source else None),
            self._worker.close,  # the steps still queued: published, shown to the detectors
            self._detectors.close,
            lambda: self.publisher.close(status=status, error=error),
        )
        for action in steps:
            if action is None:
                continue
            try:
                action()
            except Exception as exc:
                self._telemetry_failed("close()", exc)

    def _close_at_exit(self) -> None:
        """The script ended without ``close()``: an uncaught exception means the run failed."""
        self.close(*end_status(getattr(sys, "last_value", None)))

    def __enter__(self) -> Monitor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(*end_status(exc))
