"""Sampled per-layer measurements: gradient and parameter norms, update ratios, module statistics.

Most silent training errors show in one layer before they show in the loss (a layer whose ReLUs
died, gradients vanishing before the first layers, one parameter whose updates are 100x too
large). Measuring every layer on every step would cost as much as a second optimizer, so a
*sample* is taken on each of the first ``dense`` steps (bugs present from the start show at
once) and then every ``every`` steps, further apart when a sample costs more than ``budget`` of
the step time on average. A sample:

- reads every trained parameter once for its norm (one fused ``_foreach_norm``); per-parameter
  gradient norms come with the step's gradient norm, which needs them anyway;
- copies at most ``probe_elements`` elements of each trained parameter in the optimizer's step
  pre-hook and compares them in its post-hook: the update/parameter ratio ``|dw| / |w|`` on the
  same strided elements (bounded memory, whatever the model size);
- computes eight statistics of the output of each chosen module during one training forward
  (min, max, mean, std, NaN count, Inf count, share of zeros, share of units zero over the whole
  batch); the forward hooks exist only while a sample is being taken.

Everything is computed on the device and read back together with the step's loss in one
transfer (:mod:`publisher.measure.fetch`); nothing here reads a device tensor.

Defaults follow public tools: SageMaker Debugger samples tensors every N steps
(its rules default to a few hundred steps; detection latency matters more here, hence 10) and
AutoTrainer (ICSE 2021) reports ~1 % overhead on healthy runs: the order of all the Monitor's budgets together
(:mod:`publisher.measure.budget`).
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import nn

from publisher.measure.budget import CostBudget, CostMeter, Schedule, check_share
from publisher.measure.tensors import ParamNamer, unwrap
from publisher.stats.discovery import RootDiscovery
from publisher.stats.grad_norm import FusedNorms, GradNorms
from publisher.stats.layer_sample import SampleLayout, spread
from publisher.stats.probes import ActivationProbe, UpdateProbe
from publisher.telemetry_errors import TelemetryErrors

log = logging.getLogger(__name__)

#: Module types whose outputs say nothing about the model's health (zeros by design, pass-through).
_SKIPPED_MODULES = (nn.modules.dropout._DropoutNd, nn.Identity)


@dataclass(frozen=True)
class StatsConfig:
    """What a sample measures and how often.

    ``modules``: ``fnmatch`` patterns of qualified module names (``"encoder.layers.*.act"``) to
    take output statistics of; empty means every leaf layer except dropout and identity, at most
    ``max_modules`` of them spread evenly over the model. ``budget``: the share of step time
    samples may cost on average (1.0: keep to ``every`` whatever the cost).
    """

    every: int = 10
    dense: int = 10
    budget: float = 0.0025
    modules: tuple[str, ...] = ()
    max_modules: int = 64
    probe_elements: int = 1024
    #: All parameters together copy at most this many elements per sample (update ratios).
    max_probe_total: int = 1 << 20
    #: Parameters and modules listed in the published ``layers`` payload (detectors see all).
    max_published: int = 256
    activations: bool = True
    update_ratio: bool = True

    def __post_init__(self) -> None:
        for name in ("every", "max_modules", "probe_elements", "max_probe_total", "max_published"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"StatsConfig.{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.dense, int) or self.dense < 0:
            raise ValueError(f"StatsConfig.dense must be an integer >= 0, got {self.dense!r}")
        check_share(self.budget, "StatsConfig.budget")
        object.__setattr__(self, "modules", tuple(self.modules))


# --------------------------------------------------------------------------- the sampler


def default_modules(roots: Iterable[tuple[str, nn.Module]], patterns: Sequence[str], limit: int
                    ) -> list[tuple[str, nn.Module]]:
    """The modules whose outputs are measured: those matching ``patterns``, else every leaf layer
    but dropout and identity; at most ``limit``, spread evenly over the model's order."""
    chosen: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()
    for prefix, root in roots:
        for name, module in root.named_modules():
            if id(module) in seen:
                continue
            full = prefix + name
            if patterns:
                if not any(fnmatch.fnmatchcase(full, pattern) for pattern in patterns):
                    continue
            elif next(module.children(), None) is not None or isinstance(module, _SKIPPED_MODULES):
                continue  # a container, or a module whose zeros are by design
            seen.add(id(module))
            chosen.append((full, module))
    return spread(chosen, limit)


class LayerSampler:
    """Decides which steps are sampled, arms the probes before them and assembles each sample.

    Protocol with the :class:`~publisher.monitor.Monitor`, once per ``Monitor.step``: if
    :attr:`sampling`, :meth:`collect` returns the device tensors to fetch and the
    :class:`~publisher.stats.layer_sample.SampleLayout` that turns their host copies into a
    :class:`~publisher.stats.layer_sample.LayerSample`; then :meth:`advance` moves the schedule on and
    arms the probes for the next sampled step. Without a model (zero-code runs) the model
    is found at a forward, as the invariant checker does (:class:`RootDiscovery`).
    """

    def __init__(
        self,
        config: StatsConfig,
        model: nn.Module | None,
        optimizers: Sequence[torch.optim.Optimizer],
        params: Callable[[], list[torch.Tensor]],
        errors: TelemetryErrors | None = None,
    ) -> None:
        self.config = config
        #: This part's health (:mod:`publisher.telemetry_errors`): the Monitor stops sampling once it is off.
        self.part = (errors or TelemetryErrors()).part("per-layer sample")
        self.sampling = True  # the first step is sampled
        self._params = params
        self._optimizers: list[torch.optim.Optimizer] = []
        self._meter = CostMeter()
        self._calls = 0
        self._next = 1
        self._spent_at_last = 0
        self._budget = CostBudget(config.budget, every=config.every)
        self._norms = FusedNorms()
        self._namer = ParamNamer()
        self._roots: list[tuple[str, nn.Module]] = []
        self._catalog: tuple[int, list[str], list[tuple[int, ...]]] | None = None
        self._updates = (UpdateProbe(config.probe_elements, config.max_probe_total, self._meter)
                         if config.update_ratio else None)
        self._activations = ActivationProbe(self._meter) if config.activations else None
        self._discovery: RootDiscovery | None = None
        if model is not None:
            self._adopt(model)
        elif self._activations is not None:
            schedule = Schedule(max(1, config.dense), config.every)
            adopt = partial(self._adopt, discovered=True)
            self._discovery = RootDiscovery(schedule, self._trained_ids, adopt)
            self._discovery.meter = self._meter
        for optimizer in optimizers:
            self.add_optimizer(optimizer)

    @property
    def seconds_spent(self) -> float:
        """Wall time spent measuring so far (hooks and assembly), the sampler's own cost."""
        return self._meter.spent_ns / 1e9

    @property
    def roots(self) -> list[nn.Module]:
        """The model's root modules: given, or found from the optimizers (zero-code mode)."""
        return [root for _, root in self._roots]

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        if any(optimizer is known for known in self._optimizers):
            return
        self._optimizers.append(optimizer)
        if self._updates is not None:
            self._updates.watch(optimizer)

    def close(self) -> None:
        if self._updates is not None:
            self._updates.close()
        if self._activations is not None:
            self._activations.take()
        if self._discovery is not None:
            self._discovery.close()

    # -- per step --------------------------------------------------------------------------------

    def collect(self, grads: GradNorms | None) -> tuple[list[torch.Tensor], SampleLayout]:
        """Queue this step's measurements on the device: the tensors to fetch, and the layout that
        turns their host copies (with the step's gradient norms) into a sample."""
        with self._meter, torch.no_grad():
            params = self._params()
            layout = self._layout(params, grads)
            layout.floating = [i for i, p in enumerate(params) if p.is_floating_point() and p.numel() > 0]
            tensors = [self._norms([params[i].detach() for i in layout.floating])] if layout.floating else []
            if self._updates is not None:
                position = {id(p): i for i, p in enumerate(params)}
                for owned, ratios in self._updates.take():
                    tensors.append(ratios)
                    layout.updated.append([position.get(id(p), -1) for p in owned])
            if self._activations is not None:
                layout.modules, stats = self._activations.take()
                if stats is not None:
                    tensors.append(stats)
        return tensors, layout

    def gradient_layout(self, grads: GradNorms) -> SampleLayout:
        """The layout of a gradients-only sample (a step whose gradient norm was not finite)."""
        layout = self._layout(self._params(), grads)
        layout.complete = False
        return layout

    def _layout(self, params: list[torch.Tensor], grads: GradNorms | None) -> SampleLayout:
        names, shapes = self._describe(params)
        return SampleLayout(names, shapes, self._learning_rates(params), grads is not None,
                            grads.indices if grads is not None else None)

    def idle_steps(self) -> int:
        """Coming :meth:`advance` calls that would only count the step: none samples or arms
        anything, and no model is still being discovered."""
        discovery = self._discovery
        if self.sampling or (discovery is not None and not discovery.finished):
            return 0
        return max(self._next - self._calls - 2, 0)  # the last one before a sample arms the probes

    def skip(self, steps: int) -> None:
        """``steps`` calls of :meth:`advance` that were not made, within :meth:`idle_steps`."""
        self._calls += steps

    def advance(self, step_time: float | None) -> None:
        """After each ``Monitor.step``: choose the next sampled step and arm the probes for it.

        ``step_time``: the typical step time in seconds (:class:`~publisher.measure.budget.StepClock`), or
        None when not known yet; what the ``budget`` is a share of.
        """
        self._calls += 1
        if self.sampling:
            spent = self._meter.spent_ns
            self._budget.charge((spent - self._spent_at_last) / 1e9)
            self._spent_at_last = spent
            self._next = self._calls + (1 if self._calls < self.config.dense else self._budget.gap(step_time))
        self.sampling = self._calls + 1 == self._next
        discovery = self._discovery
        if discovery is not None and not discovery.finished and (
                discovery.armed or discovery.schedule.due(self._calls + 1)):
            discovery.after_step(self._calls + 1)
        if self.sampling:
            if self._updates is not None:
                self._updates.arm()
            if self._activations is not None:
                self._activations.arm()

    # -- names and settings ---------------------------------------------------------------------

    def _adopt(self, model: nn.Module, discovered: bool = False) -> None:
        root = unwrap(model)
        if any(root is known for _, known in self._roots):
            return
        prefix = f"{type(root).__name__}." if discovered or self._roots else ""
        self._roots.append((prefix, root))
        self._namer.add_root(root, prefix)
        self._catalog = None
        if self._activations is not None:
            config = self.config
            self._activations.modules = default_modules(self._roots, config.modules, config.max_modules)

    def _trained_ids(self) -> set[int]:
        return {id(p) for p in self._params()}

    def _describe(self, params: list[torch.Tensor]) -> tuple[list[str], list[tuple[int, ...]]]:
        catalog = self._catalog
        if catalog is None or catalog[0] != id(params):
            labels: dict[int, str] = {}  # id(parameter) -> its place among the optimizers
            for o, optimizer in enumerate(self._optimizers):
                for g, group in enumerate(optimizer.param_groups):
                    for n, p in enumerate(group["params"]):
                        labels.setdefault(id(p), f"optimizer{o}.group{g}.{n}")
            names = [self._namer.name(p, labels.get(id(p), f"param{i}")) for i, p in enumerate(params)]
            catalog = self._catalog = (id(params), names, [tuple(p.shape) for p in params])
        return catalog[1], catalog[2]

    def _learning_rates(self, params: list[torch.Tensor]) -> list[float | None]:
        lr_of: dict[int, float | None] = {}
        for optimizer in self._optimizers:
            for group in optimizer.param_groups:
                lr = group.get("lr")
                value = float(lr) if isinstance(lr, int | float) or (
                    isinstance(lr, torch.Tensor) and lr.device.type == "cpu" and lr.numel() == 1) else None
                for p in group["params"]:
                    lr_of.setdefault(id(p), value)
        return [lr_of.get(id(p)) for p in params]
