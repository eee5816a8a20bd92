"""``Monitor``: the few lines a PyTorch training loop adds to be watched live by tuimon.

    mon = Monitor(model, optimizer, run="exp1", config=cfg, record="run.jsonl")
    for batch in mon.track_data(loader):      # optional: measures data_time
        loss = ...; loss.backward(); optimizer.step()
        mon.step(loss, tokens=n_tokens, samples=batch_size)
        optimizer.zero_grad()
    mon.close()                               # or: with Monitor(...) as mon: ...

This module is the training thread's side: it reads what cannot wait and queues a few device
operations per step, then hands the step's readings (:class:`~publisher.readings.step.StepReadings`)
to the step worker's thread (:mod:`publisher.threads.step_worker`). Everything it feeds is built
in :mod:`publisher.wiring`: completing the step's metrics (:mod:`publisher.completion`),
publishing it and showing it to the detectors (:mod:`publisher.reporter`) run on the step
worker's thread, numbering, encoding, sending and recording in the publisher's own process
(:mod:`publisher.wire.sidecar`, handed the messages once per hand-off period), GPU polling on the
sampler's thread. On CUDA the step's numbers reach the host through
one asynchronous copy (:mod:`publisher.measure.fetch`): no host-device synchronisation per step.
Every few steps a per-layer sample (:mod:`publisher.stats.sampler`) rides along; the training
invariants (:mod:`publisher.invariants`) watch the optimizers through their hooks. Telemetry must
never cost a run: after construction, nothing here raises because of monitoring (errors are
counted in :attr:`Monitor.telemetry_errors` and logged once).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from numbers import Real
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import torch

from publisher.detectors import Detector
from publisher.invariants import InvariantConfig
from publisher.measure.budget import QuietPart
from publisher.measure.fetch import DeviceFetch
from publisher.nonfinite.guard import GuardSettings, NonFiniteGuard
from publisher.patches import torch_calls
from publisher.readings import sysinfo
from publisher.readings.batches import BatchPrint, LoaderBook, LoaderPasses
from publisher.readings.compute_time import ComputeTimer
from publisher.readings.identity import default_rank, default_run_name, default_world_size
from publisher.readings.memory import MemoryReader
from publisher.readings.memory_cadence import DEFAULT_INTERVAL_S
from publisher.readings.params import TrainedParams
from publisher.readings.step import StepReadings, group_rates, host_numbers, lr_names
from publisher.readings.timing import StepTimer
from publisher.stats.grad_norm import BudgetedGradNorm, GradNorms
from publisher.stats.sampler import StatsConfig
from publisher.telemetry_errors import Part, TelemetryErrors
from publisher.wire.protocol import RUN_END_STATUSES
from publisher.wire.run_end import end_status, end_status_at_exit
from publisher.wire.validation import MAX_METRICS, MAX_NAME_CHARS
from publisher.wiring import MonitorParts

T = TypeVar("T")
#: Quiet steps planned at once at most (:meth:`Monitor._plan_quiet`): a bound on how long a change
#: the quiet steps do not look for can go unseen.
QUIET_STEPS_MAX = 256

#: Share of the step time the gradient norm may cost on average. Computing it reads every
#: gradient once: negligible on a GPU, but on a CPU a 2M-parameter model pays ~1 ms, 5 % of a
#: 20 ms step; it is then computed every few steps to stay within this budget.
GRAD_NORM_BUDGET = 0.005
#: Batch fingerprints kept for one step (a step that consumes more batches, gradient
#: accumulation, keeps the first ones).
_BATCHES_PER_STEP = 64
#: Metrics a sampled step adds to the step's own (``param_norm``, ``update_ratio``): kept free
#: when the caller's extras fill the message towards the protocol's limit.
_SAMPLE_TOTALS = 8
#: Extras a quiet step takes, less one per learning rate: room for the loss and a sample's totals.
_QUIET_EXTRAS_ROOM = MAX_METRICS - 1 - _SAMPLE_TOTALS


class Monitor:
    """Collects a run's metrics, GPU readings, anomaly events and invariants and publishes them for tuimon.

    Construction sends ``run_start`` (config, seed, command, versions, reproduction record) and
    starts GPU sampling; it raises on bad arguments (an unusable ``endpoint``, ``gpu="nvml"``
    without a driver, an invalid configuration) because that is the moment a user can fix them.

    ``gpu``: ``"auto"`` (NVML when there is a driver, else off, said once), ``"nvml"``,
    ``"simulated"`` (a demo source, marked simulated everywhere) or ``"none"``. GPUs are the
    node's, so only local rank 0 (``$LOCAL_RANK``, default 0) samples them.
    ``detectors``: True for :func:`~publisher.detectors.default_detectors`, False for none, or
    your own list of :class:`~publisher.detectors.base.Detector`. With True, those that read only
    a step's metrics run in the publisher's process, off this one's GIL
    (:mod:`publisher.detectors.published`); a list of your own runs on the step worker.
    ``grad_norm_budget``: the share of step time the gradient norm may cost on average (default
    0.5 %; 1.0 computes it on every step whatever it costs).
    ``stats``: per-layer samples (gradient and weight norms, update ratios, module output
    statistics): True for the defaults of :class:`~publisher.stats.sampler.StatsConfig`, a
    ``StatsConfig``, or False.
    ``invariants``: the training invariants (:mod:`publisher.invariants`): True for the defaults,
    an :class:`~publisher.invariants.InvariantConfig`, or False. They need the optimizer(s).
    ``memory_interval_s``: how often host and CUDA memory are read at least (0: every step); they
    are also read every few steps (:data:`~publisher.readings.memory_cadence.DEFAULT_EVERY_STEPS`).
    ``hang_after_s``: seconds without a step after which the thread that calls :meth:`step`
    counts as stalled (:mod:`publisher.wire.stall`): stuck (a ``hang`` event), busy elsewhere
    (``busy_pause``) or waiting in a collective (``collective_wait``), named by where it is
    (:mod:`publisher.threads.watchdog`); None (the default) for max(5 s, 10 typical steps).
    Heartbeats carry ``stalled_s`` from the first step on either way, and the thread's stack from
    half the threshold on.
    ``on_nonfinite``: what a step whose gradients are NaN or Inf does, checked before the optimizer
    applies them (:mod:`publisher.nonfinite`): ``"report"`` (the default: training unchanged),
    ``"skip"`` (the update is dropped, counted as ``nonfinite_skipped``) or ``"stop"``
    (:class:`~publisher.nonfinite.guard.NonFiniteStop` out of ``optimizer.step()``). Either way
    the first bad step of an episode is re-run to name the module that produced the first
    non-finite value (a ``nonfinite_origin`` event) and a repro bundle is written next to the
    recording; ``repro_weights`` puts the weights in it too.
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
        repeated_batches: bool = False,
        hang_after_s: float | None = None,
        on_nonfinite: str = "report",
        repro_weights: bool = False,
    ) -> None:
        self._params = TrainedParams(model, optimizer)
        # Settings are checked before anything binds a port or starts a thread.
        memory = MemoryReader(memory_interval_s, self._params.device)  # read by the step worker
        self._timer = StepTimer()
        self._errors = TelemetryErrors()
        #: The parts of a full step that fail alone (:meth:`_part`); the loss is never switched off.
        self._loss_part = self._errors.part("loss", can_stop=False)
        self._lr_part = self._errors.part("learning rate")
        self._guard_part = self._errors.part("non-finite check")
        self._invariants_part = self._errors.part("invariants")
        self._planning = self._errors.part("quiet-step planning")
        #: The caller's extras whose part was switched off (each failed on every step).
        self._extras_off: set[str] = set()
        self._compute = ComputeTimer(on_error=self._errors.failed)
        self._compute.watch(self._params.params)
        self._grad_norm = BudgetedGradNorm(grad_norm_budget, self._timer.clock)
        self.run = run or default_run_name()
        self.rank = default_rank() if rank is None else rank
        self.world_size = default_world_size() if world_size is None else world_size
        # One seed for run_start, every event's replay record and the repro bundles: torch's own
        # where none is given.
        seed = sysinfo.torch_seed() if seed is None else seed
        guard_settings = GuardSettings(on_nonfinite, self.run, self.rank,
                                       None if record is None else Path(record), seed, bool(repro_weights))
        self._closed = False
        self._pid = os.getpid()
        self._fetch = DeviceFetch()
        self._step = 0
        #: Coming steps that need no more than :meth:`step`'s quiet path (:meth:`_plan_quiet`), and the
        #: primary optimizer's parameter groups they read the learning rates from.
        self._quiet = 0
        self._quiet_groups: list[dict[str, Any]] = []
        #: The number of the last step of the quiet run planned last (-1: none).
        self._quiet_last = -1
        self._loss_on_device = False
        stats_config = StatsConfig() if stats is True else stats or None
        self._parts = MonitorParts(
            run=self.run, rank=self.rank, world_size=self.world_size, params=self._params,
            timer=self._timer, compute=self._compute, memory=memory, errors=self._errors,
            current_step=lambda: self._step,
            config=config, seed=seed, endpoint=endpoint, record=record, gpu=gpu, gpu_interval=gpu_interval,
            detectors=detectors,
            stats=stats_config,
            invariants=InvariantConfig() if invariants is True else invariants or None,
            hang_after_s=hang_after_s,
            monitoring={
                "on_nonfinite": on_nonfinite, "grad_norm_budget": grad_norm_budget,
                "detectors": detectors if isinstance(detectors, bool) else "custom",
                "stats_budget": stats_config.budget if stats_config is not None else None,
                "invariants": bool(invariants), "hang_after_s": hang_after_s,
                "repeated_batches": bool(repeated_batches), "memory_interval_s": memory_interval_s,
                "gpu": gpu,
            },
        )
        self._reporter = self._parts.reporter
        self._context = self._reporter.detectors.context
        self._context.update(repeated_batches=bool(repeated_batches), optimizers=len(self._params.optimizers))
        self._calls = torch_calls.watch(self._saw_classes)
        self._parts.completion.calls = self._calls  # the step worker reads the looks
        self._loaders = LoaderBook()
        self._batches: list[BatchPrint] = []
        #: The publisher (socket, recording, registry entry) and the GPU source, for callers
        #: that drive them directly (the demo's scripted GPU incidents).
        self.publisher = self._parts.publisher
        self.gpu_source = self._parts.gpu_source
        self._layers = self._parts.layers
        self._invariants = self._parts.invariants
        #: The checker's own ``offer_graph`` (one call less on every step), None without invariants.
        self._offer_graph = self._invariants.checker.offer_graph if self._invariants is not None else None
        #: The invariants' step numbering kept in line on every step, quiet ones too: the checker's
        #: hooks may judge on the next one whatever the Monitor does (:meth:`InvariantChecker.idle_steps`).
        self._sync_invariants = self._invariants.sync if self._invariants is not None else None
        self._watchdog = self._parts.watchdog
        self._queue_quiet = self._parts.worker.append_unchecked
        self._batch: Any = None  # the latest batch, by reference (a repro bundle holds it)
        self._guard = self._nonfinite_guard(guard_settings, model)
        self._quiet_parts: list[QuietPart] = []
        self._list_quiet_parts()
        atexit.register(self._close_at_exit)

    def _nonfinite_guard(self, settings: GuardSettings,
                         model: torch.nn.Module | None) -> NonFiniteGuard | None:
        """The check before each update (:mod:`publisher.nonfinite.guard`), where there is an optimizer."""
        if not self._params.optimizers:
            return None
        guard = NonFiniteGuard(settings, measure=self._measure_grads, current_step=lambda: self._step,
                               tracker=self._reporter.detectors.tracker,
                               batch=lambda: self._batch,
                               on_error=self._telemetry_failed, roots=self._model_roots,
                               step_seconds=lambda: self._timer.clock.seconds)
        for optimizer in self._params.optimizers:
            guard.watch(optimizer)
        if model is not None:
            guard.capture.attach(model)
        return guard

    def _model_roots(self) -> list[torch.nn.Module]:
        """The models found so far (given, or discovered by the layer sampler)."""
        return self._layers.roots if self._layers is not None else []

    def _measure_grads(self, force: bool) -> GradNorms | None:
        """The step's gradient norms, as :meth:`step` would measure them (``force``: whatever the budget)."""
        if not self._params.params:
            return None
        if force or (self._layers is not None and self._layers.sampling):
            return self._grad_norm.now(self._params.current())
        return self._grad_norm.due(self._params.current, self._timer.last_at)  # the step to be recorded

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
        by :meth:`track_data`), ``compute_time`` (the step's own work, from its first batch to
        its last gradient, so without the wait in DDP's all-reduce; on a CUDA device timed by
        events, for the latest step the device has finished: :mod:`publisher.readings.compute_time`),
        memory (``host_mem_bytes``, ``cuda_mem_*``, every ``memory_interval_s``), on sampled
        steps ``param_norm``, ``update_ratio`` and the per-layer ``layers`` payload, and any
        numeric ``extra`` (an extra with a standard name, such as ``grad_norm=`` or ``lr=``,
        replaces the computed one).
        ``step`` defaults to the previous step + 1 (the first call is step 1).

        Host-device syncs on CUDA: none. The loss, the gradient norms, tensor extras and sampled
        statistics are copied to the host together, asynchronously; the step's ``metrics``
        message is published once they have arrived, usually during one of the next calls (at
        the latest at :meth:`close`). Nothing here raises because of telemetry.
        """
        try:
            # A step on which nothing is due (a *quiet* one: :meth:`_plan_quiet`) takes the least
            # the training thread must read now (the time, the loss and any extras on the CPU, the
            # learning rates, the compute marks, the batches' fingerprints, the looks at its loss
            # calls), queued as one tuple; the step worker builds the rest. A ``step`` given (the
            # framework callbacks give theirs) is taken as it is, and the invariants' step numbering
            # is synced to it. One that needs more (a loss or an extra on a device, a clip without
            # gradients, a learning rate that is not a float, an extra that is no number) takes the
            # full path, and the quiet steps end there. Written out here, not called: in place,
            # between training steps whose kernels have evicted the caches, each Python call costs
            # microseconds (the full step costs ~27 times what appending the loss to a list does, and
            # ~4-15 times its own cost warm: ``benchmarks/step_floor.py``).
            if self._quiet:
                calls, groups = self._calls, self._quiet_groups
                lr = groups[0]["lr"] if len(groups) == 1 else group_rates(groups)
                numbers = host_numbers(extra, _QUIET_EXTRAS_ROOM - len(groups)) if extra else None
                if (not calls.clips_without_gradients and (type(lr) is float or (len(groups) > 1 and lr))
                        and (not isinstance(loss, torch.Tensor) or loss.is_cpu) and (numbers or not extra)):
                    value = loss.item() if isinstance(loss, torch.Tensor) else loss
                    if value is not None and type(value) is not float:  # a NumPy or integer loss
                        value = float(value) if isinstance(value, Real) and type(value) is not bool else None
                        if value is None:  # no real number (complex, a string): the full path says so
                            self._record_step(loss, tokens, samples, data_time, step, extra)
                            return
                    now = time.perf_counter()
                    self._quiet -= 1
                    self._step = step = self._step + 1 if step is None else int(step)
                    timer = self._timer
                    previous, timer.last_at = timer.last_at, now  # the step clock is the step worker's
                    batches = self._batches
                    if batches:
                        self._batches = []
                    if self._sync_invariants is not None:
                        self._sync_invariants(step)
                    # Unchecked: the full steps, at most QUIET_STEPS_MAX apart, check the queue's bound.
                    self._queue_quiet((step, now, previous, value, lr, tokens, samples,
                                       timer.data_time(data_time), self._compute.take(now), tuple(batches),
                                       tuple(calls.take_looks()) if calls.waiting else (), numbers))
                    return
            self._record_step(loss, tokens, samples, data_time, step, extra)
        except Exception as exc:
            self._telemetry_failed("step()", exc)

    def _plan_quiet(self) -> None:
        """After a full step: how many coming steps need no more than :meth:`step`'s quiet path, the
        fewest any of the quiet parts allows (:meth:`_list_quiet_parts`: the gradient norm's budget,
        the non-finite check's hooks, the layer sampler's next sample, the invariant checker's next
        work); they are told at once that those steps will pass (a quiet run that ends early gives
        back the steps it did not take: :meth:`_unplan_quiet`).
        None while copies from a device are on their way (the steps must reach the worker in
        order), without an optimizer, or where a learning rate is not a float. Called at the end of
        the full step, which has set ``_quiet`` to 0."""
        optimizer = self._params.primary
        if self._loss_on_device or optimizer is None:
            return  # a loss on a device is copied with the step's other numbers: no quiet step
        groups = optimizer.param_groups
        if not group_rates(groups) or self._fetch.pending:
            return
        parts = self._quiet_parts
        quiet = min(QUIET_STEPS_MAX, *(part.idle_steps() for part in parts)) if parts else QUIET_STEPS_MAX
        if quiet <= 0:
            return
        for part in parts:
            part.skip(quiet)
        self._quiet_groups = groups
        self._quiet = quiet
        self._quiet_last = self._step + quiet

    def _list_quiet_parts(self) -> None:
        """The parts the quiet steps are planned with (:class:`~publisher.measure.budget.QuietPart`):
        the gradient norm's budget where there are parameters, the non-finite check, the layer
        sampler, the invariant checker; made anew when one joins or goes."""
        candidates = (self._grad_norm if self._params.params else None, self._guard, self._layers,
                      self._invariants.checker if self._invariants is not None else None)
        self._quiet_parts = [part for part in candidates if part is not None]

    def _unplan_quiet(self) -> None:
        """A full step where a quiet one was planned: the parts told that the quiet run's steps
        would pass (:meth:`_plan_quiet`) get back those that will not, this one included. Without
        this, a loop whose every step is full (an extra of a type read on the full path only, a
        clip without gradients) brought each part's work forward a whole run on every step: a
        sample and a gradient norm nearly every step, ~100 us a step on a 1 ms MLP."""
        unplanned, self._quiet = self._quiet, 0
        for part in self._quiet_parts:
            part.skip(-unplanned)

    def _record_step(
        self,
        loss: torch.Tensor | float | None,
        tokens: int | None,
        samples: int | None,
        data_time: float | None,
        step: int | None,
        extra: dict[str, Any],
    ) -> None:
        """The training thread's half of a step: read what cannot wait, queue the rest raw for the
        step worker (:mod:`publisher.completion`). The step, its time and its loss are read first;
        every other part fails alone (:mod:`publisher.telemetry_errors`), named in the step's
        ``failed``, and the step is queued whatever they do."""
        now = time.perf_counter()
        if self._quiet:
            self._unplan_quiet()
        self._watchdog.thread_id = threading.get_ident()  # the thread whose stalls it reports
        ends_quiet_run = self._step == self._quiet_last  # this step is full where it could be quiet
        step = self._step + 1 if step is None else int(step)
        self._step = step
        timer = self._timer
        readings = StepReadings(step, now, timer.last_at)  # the step clock is the step worker's
        timer.last_at = now
        readings.tokens, readings.samples = tokens, samples
        readings.data_time = timer.data_time(data_time)
        self._loss_on_device = isinstance(loss, torch.Tensor) and not loss.is_cpu
        if loss is not None:
            self._read_loss(loss, readings)
        layers = self._layers
        if layers is not None and not layers.part.on:  # switched off (it failed on every step)
            self._drop_layers()
            layers = None
        sampling = layers is not None and layers.sampling
        if self._batches:
            readings.batches, self._batches = tuple(self._batches), []
        calls = self._calls
        if calls.clips_without_gradients:  # clip calls that found no gradient since the last step
            readings.metrics["clip_noop_calls"] = float(calls.take_clips_without_gradients())
        if calls.waiting:  # looks taken, perhaps still on their way to the host
            readings.looks = tuple(calls.take_looks())
        grads = None if "grad_norm" in extra else self._read_grad_norm(sampling, readings)
        guard = self._guard
        if guard is not None and guard.skipped:
            readings.metrics["nonfinite_skipped"] = float(guard.skipped)
        self._part(self._lr_part, readings, self._read_lr, readings)
        readings.compute = self._compute.take(now)  # a broken mark is counted there
        if extra:
            self._read_extras(extra, readings)
        self._send(readings, grads, sampling)
        # The step is on its way; what follows prepares the next ones, each part alone.
        if layers is not None:
            self._part(layers.part, None, layers.advance, timer.clock.seconds)
        # A gradient norm measured for this step (not a sample's) is charged this path too where
        # it took the place of a quiet step.
        self._grad_norm.settle(time.perf_counter() - now if ends_quiet_run else 0.0)
        if guard is not None:
            due_in = 0 if layers is not None and layers.sampling else self._grad_norm.idle_steps()
            self._part(self._guard_part, None, guard.next_step, due_in)
        if self._sync_invariants is not None:
            self._part(self._invariants_part, None, self._sync_invariants, step)
        self._part(self._planning, None, self._plan_quiet)

    def _drop_layers(self) -> None:
        """The per-layer sampler is switched off: its probes go, no step is sampled any more."""
        layers, self._layers = self._layers, None
        self._parts.completion.layers = self._parts.layers = None
        self._list_quiet_parts()
        if layers is not None:
            try:
                layers.close()
            except Exception as exc:
                self._telemetry_failed("per-layer sample", exc)

    def _part(self, part: Part, readings: StepReadings | None, action: Callable[..., object],
              *args: Any) -> None:
        """Run one part of the step alone: a failure costs that part only, and is named in the
        step's ``failed`` where the step is still being read."""
        if not part.on:
            return
        try:
            action(*args)
        except Exception as exc:
            part.failed(exc, self._step)
            if readings is not None:
                readings.failed.append(part.name)

    def _read_loss(self, loss: torch.Tensor | float, readings: StepReadings) -> None:
        """The loss, read first (a NaN in it is named whatever fails after): one number, a tensor
        of one element (any dtype, with or without a graph) or a Python or NumPy number. One that
        cannot be read is a failed part (``loss``) and the step goes out without it."""
        try:
            if isinstance(loss, torch.Tensor):
                if loss.numel() != 1:
                    raise ValueError(f"the loss must be one number, not of shape {tuple(loss.shape)}")
                if loss.is_complex():
                    raise TypeError("the loss is a complex number")
                if self._offer_graph is not None:
                    self._part(self._invariants_part, readings, self._offer_graph, loss)
            readings.add("loss", loss)
        except Exception as exc:
            self._loss_part.failed(exc, readings.step)
            readings.failed.append(self._loss_part.name)

    def _read_grad_norm(self, sampling: bool, readings: StepReadings) -> GradNorms | None:
        """The gradient norms on a sampled step, else as often as ``grad_norm_budget`` allows
        (measured before the update by the non-finite check, where it ran: the same gradients)."""
        if not self._params.params:
            return None
        guard = self._guard
        try:
            if guard is not None and guard.measured:
                grads = guard.norms
            else:
                grads = (self._grad_norm.now(self._params.current()) if sampling
                         else self._grad_norm.due(self._params.current, readings.previous_at))
        except Exception as exc:  # a broken measurement costs itself, not the step's metrics
            self._errors.failed("gradient norm", exc, readings.step)
            readings.failed.append("gradient norm")
            return None
        if grads is not None:
            readings.add("grad_norm", grads.total)
        return grads

    def _read_lr(self, readings: StepReadings) -> None:
        """The primary optimizer's learning rates: ``lr``, then ``lr/1``... for further groups
        (capturable optimizers keep them on the device)."""
        optimizer = self._params.primary
        if optimizer is None:
            return
        groups = optimizer.param_groups
        lr = groups[0]["lr"] if groups else None
        if type(lr) is float and len(groups) == 1:  # the common case, with fewer calls
            readings.metrics["lr"] = lr
            return
        for name, group in zip(lr_names(len(groups)), groups, strict=True):
            readings.add(name, group["lr"])

    def _read_extras(self, extra: dict[str, Any], readings: StepReadings) -> None:
        """The caller's own numbers; one that is not a number, or beyond the protocol's bounds for
        names, costs itself only."""
        room = MAX_METRICS - len(readings.metrics) - len(readings.waiting) - _SAMPLE_TOTALS
        for name, value in extra.items():
            if name in self._extras_off:  # it failed on every step: switched off
                continue
            try:
                if len(name) > MAX_NAME_CHARS or room <= 0:
                    raise ValueError(f"over {MAX_METRICS} metrics, or a name over {MAX_NAME_CHARS} chars")
                room -= 1
                if isinstance(value, torch.Tensor) and value.numel() != 1:
                    raise ValueError(f"a tensor of shape {tuple(value.shape)} is not one number")
                readings.add(name, value)
            except Exception as exc:
                part = self._errors.part(f"metric {name!r}")
                part.failed(exc, readings.step)
                readings.failed.append(part.name)
                if not part.on:
                    self._extras_off.add(name)

    def _send(self, readings: StepReadings, grads: GradNorms | None, sampling: bool) -> None:
        """Queue the step for the step worker: at once when every number is on the host, else once
        the fetch has brought them (during a later step, or at close())."""
        readings.grads = grads
        # Per-parameter gradient norms, then the sample's tensors: read only when needed, on arrival.
        arrays = [grads.norms] if grads is not None else []
        if sampling:
            assert self._layers is not None
            try:
                parts, readings.layout = self._layers.collect(grads)
                arrays += parts
            except Exception as exc:
                self._layers.part.failed(exc, readings.step)
                readings.failed.append(self._layers.part.name)
        waiting = readings.waiting
        # Arrays live where the parameters do: the first one tells.
        if waiting or self._fetch.pending or (arrays and not arrays[0].is_cpu):
            try:
                self._fetch.submit([t for _, t in waiting] + arrays, partial(self._arrived, readings))
                return
            except Exception as exc:  # the step goes out with what is on the host
                self._errors.failed("device copy", exc, readings.step)
                readings.failed.append("device copy")
                readings.waiting, readings.grads, readings.layout, arrays = [], None, None, []
        readings.values = arrays
        self._parts.worker.submit(readings)

    def _arrived(self, readings: StepReadings, values: list[torch.Tensor]) -> None:
        """A step's device numbers are on the host (a later step, or close()): queue the step."""
        readings.values = values
        self._parts.worker.submit(readings)

    def offer_graph(self, loss: torch.Tensor) -> None:
        """A loss about to be (or just) backpropagated, its autograd graph attached: on a few
        sampled steps the invariants walk it for tensors that get gradients and that no optimizer
        steps, outside the model too (:mod:`publisher.invariants.leaves`). :meth:`step` does this
        for a loss tensor it is given; the zero-code launcher's ``backward`` hook calls it."""
        try:
            if self._offer_graph is not None:
                self._offer_graph(loss)
        except Exception as exc:
            self._telemetry_failed("offer_graph()", exc)

    def ignore_unowned(self, *tensors: torch.Tensor) -> None:
        """Tensors that receive gradients with no optimizer stepping them on purpose (an input
        optimised by hand, a saliency map kept across steps): not reported as unowned."""
        if self._invariants is not None:
            self._invariants.checker.ignore_unowned(tensors)

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Watch one more optimizer (a GAN's second one): its parameters join the gradient norm,
        the per-layer samples and the invariants.

        The first optimizer stays the primary one, whose learning rate is reported as ``lr``.
        """
        if not self._params.add_optimizer(optimizer):
            return
        self._context.update(optimizers=len(self._params.optimizers))
        try:
            self._compute.watch(self._params.params)
            if self._layers is not None:
                self._layers.add_optimizer(optimizer)
            if self._invariants is not None:
                self._invariants.add_optimizer(optimizer)
            if self._guard is not None:
                self._guard.watch(optimizer)
        except Exception as exc:
            self._telemetry_failed("add_optimizer()", exc)
        self._list_quiet_parts()  # the gradient norm joins with the first parameters

    def track_data(self, iterable: Iterable[T]) -> Iterator[T]:
        """Iterate ``iterable`` (one pass, an epoch, over a DataLoader or any iterable of batches),
        timing each fetch (the next :meth:`step` reports it as ``data_time``) and fingerprinting
        each batch (repeated batches are reported: ``Monitor(repeated_batches=True)`` says they
        are deliberate)."""
        passes = self._loaders.passes_for(iterable)
        passes.new_pass()
        for item in self._timer.track(iterable):
            self.batch_arrived(self._timer.last_fetch_s, item)
            self.note_batch(passes, item)
            yield item

    def batch_arrived(self, waited_s: float, batch: Any = None) -> None:
        """A batch reached the loop after ``waited_s`` seconds (``track_data``, ``tuimon run``): the
        step's own work, timed as ``compute_time``, starts with its first batch."""
        self.hold_batch(batch)
        try:
            self._compute.batch_arrived(waited_s)
        except Exception as exc:
            self._telemetry_failed("compute time", exc)

    def hold_batch(self, batch: Any) -> None:
        """The batch the training is using, kept by reference until the next one: a repro bundle
        holds the step's batch (nothing is copied on a healthy step)."""
        self._batch = batch

    def note_batch(self, passes: LoaderPasses, batch: Any) -> None:
        """Fingerprint a batch the training is about to use (``track_data``, ``tuimon run``)."""
        try:
            found = passes.print_of(batch)
        except Exception as exc:
            self._telemetry_failed("batch fingerprint", exc)
            return
        if found is not None and len(self._batches) < _BATCHES_PER_STEP:
            self._batches.append(found)

    def _saw_classes(self, classes: int, label_entropy: float | None) -> None:
        """The loss watch saw the logits' class count (and the labels' entropy)."""
        self._context.update(classes=classes, label_entropy=label_entropy)

    # -- events ---------------------------------------------------------------------------------

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
            if step is None:
                step = self._step or None
            return self._reporter.event(kind, message, severity, step, details)
        except Exception as exc:
            self._telemetry_failed("event()", exc)
            return None

    # -- plumbing -------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """Address of the ZeroMQ PUB socket a viewer connects to."""
        return self.publisher.endpoint

    @property
    def current_step(self) -> int:
        """The last step recorded (0 before the first :meth:`step`)."""
        return self._step

    @property
    def telemetry_errors(self) -> int:
        """How many times monitoring itself failed (training went on each time)."""
        return self._errors.count

    def _telemetry_failed(self, what: str, exc: BaseException) -> None:
        self._errors.failed(what, exc)

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
        self._timer.stop()
        torch_calls.unwatch(self._calls)
        atexit.unregister(self._close_at_exit)
        if self._guard is not None:
            self._guard.close()
        # The last steps' metrics, still on the device, first: then the parts, in their order (the
        # step worker's last steps read the compute time's marks: its hooks go last).
        actions: list[Callable[[], None]] = [partial(self._fetch.drain, wait=True),
                                             *self._parts.closers(status, error), self._compute.close]
        for action in actions:
            try:
                action()
            except Exception as exc:
                self._telemetry_failed("close()", exc)

    def _close_at_exit(self) -> None:
        """The script ended without ``close()``: an uncaught exception means the run failed."""
        self.close(*end_status_at_exit())

    def __enter__(self) -> Monitor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(*end_status(exc))
