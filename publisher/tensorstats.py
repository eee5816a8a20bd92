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
transfer (:mod:`publisher.fetch`); nothing here reads a device tensor.

Defaults cite ``shared/notes/prior-art.md``: SageMaker Debugger samples tensors every N steps
(its rules default to a few hundred steps; detection latency matters more here, hence 10) and
AutoTrainer reports ~1 % overhead on healthy runs: the order of all the Monitor's budgets together
(:mod:`publisher.budget`).
"""

from __future__ import annotations

import fnmatch
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from publisher.budget import CostBudget, check_share
from publisher.invariants.config import InvariantConfig
from publisher.invariants.core import CostMeter, ParamNamer, flat_sample, sample_stride, stack_on, unwrap
from publisher.invariants.discovery import RootDiscovery
from publisher.layer_sample import SampleLayout, spread

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


# --------------------------------------------------------------------------- device-side measures


@dataclass
class GradNorms:
    """Per-parameter gradient norms of one step, still on the device.

    ``indices``: positions (in the parameter list given) of the parameters that had a gradient,
    or None when all had one; ``norms``: one float32 norm each; ``total``: the global L2 norm.
    """

    indices: list[int] | None
    norms: torch.Tensor
    total: torch.Tensor


def _norm(tensor: torch.Tensor) -> torch.Tensor:
    """L2 norm as float32 of a dense or sparse tensor (a sparse one: of its coalesced values).

    Half-precision tensors are summed in float32 (their own range overflows at 65504), float64
    ones in float64 (torch refuses to narrow them while reducing).
    """
    if tensor.is_sparse:
        tensor = tensor.coalesce().values()
    wide = tensor.dtype.itemsize >= 4 if tensor.is_floating_point() else True
    return torch.linalg.vector_norm(tensor, dtype=None if wide else torch.float32).float()


class FusedNorms:
    """Norms of many tensors in one ``_foreach_norm``; tensors on several devices, sparse or
    float64 tensors take a per-tensor path, chosen once when the fused one fails."""

    def __init__(self) -> None:
        self._per_tensor = False

    def __call__(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        if not self._per_tensor:
            try:
                return torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float32))
            except (RuntimeError, NotImplementedError):
                self._per_tensor = True
        return stack_on([_norm(t) for t in tensors], tensors[0].device)


class GradNormer:
    """:class:`GradNorms` of the gradients a parameter list holds now (no host-device sync)."""

    def __init__(self) -> None:
        self._norms = FusedNorms()

    def __call__(self, params: Sequence[torch.Tensor]) -> GradNorms | None:
        grads = [p.grad for p in params]
        present = [g for g in grads if g is not None]
        if not present:
            return None
        indices = None if len(present) == len(grads) else [i for i, g in enumerate(grads) if g is not None]
        norms = self._norms(present)
        return GradNorms(indices, norms, torch.linalg.vector_norm(norms))


def activation_stats(output: torch.Tensor) -> torch.Tensor:
    """The :data:`~publisher.layer_sample.ACTIVATION_FIELDS` of one tensor, a float32 vector on its device.

    ``dead_frac`` is the share of units whose output is zero for every one of the values each
    unit produced (samples of the batch, positions: :func:`rows_per_unit`): DeepDiagnosis's dead
    nodes, SageMaker's units never active. Units are channels (dim 1) for 4-d and 5-d outputs
    (convolutions), the last dimension otherwise. NaN counts as non-zero.

    Written for reductions that are fast everywhere: on a CPU, boolean masks and ``std_mean`` cost
    5 to 20 times a plain sum (measured: 28 ms for the naive version on a 32x128x512 output, 9 ms
    for this one, single thread), so the spread comes from the sum and the norm, dead units from
    per-unit max and min, the zeros from ``sign``.
    """
    x = output.detach()
    values = x if x.dtype == torch.float32 else x.float()
    n = values.numel()
    low, high = torch.aminmax(values)
    mean = values.sum() / n
    root_sum_sq = torch.linalg.vector_norm(values)
    std = (root_sum_sq * root_sum_sq / n - mean * mean).clamp_min(0).sqrt()
    nan = torch.count_nonzero(torch.isnan(values))
    # sign() of NaN is 0 on some devices and NaN on others: count NaN apart, as non-zero.
    zero_frac = 1 - (values.sign().abs_().nan_to_num_(0.0).sum() + nan) / n
    if values.ndim >= 2:
        unit_dim = _unit_dim(values)
        batch_dims = tuple(d for d in range(values.ndim) if d != unit_dim)
        dead = ((values.amax(dim=batch_dims) == 0) & (values.amin(dim=batch_dims) == 0)).float().mean()
    else:
        dead = zero_frac
    inf = torch.count_nonzero(torch.isinf(values))
    return torch.stack([low, high, mean, std, nan.float(), inf.float(), zero_frac, dead])


def _unit_dim(x: torch.Tensor) -> int:
    return 1 if x.ndim >= 4 else x.ndim - 1


def rows_per_unit(x: torch.Tensor) -> int:
    """How many values each unit produced (batch x positions): how much a dead unit says."""
    return x.numel() // x.shape[_unit_dim(x)] if x.ndim >= 2 else 1


def _first_float_tensor(value: Any) -> torch.Tensor | None:
    """The tensor a module returned, or the first floating tensor of a tuple/list/dict it returned."""
    if isinstance(value, torch.Tensor):
        return value if value.is_floating_point() and value.numel() > 0 else None
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        for item in value:
            found = _first_float_tensor(item) if isinstance(item, torch.Tensor) else None
            if found is not None:
                return found
    return None


class ActivationProbe:
    """Forward hooks on the chosen modules for one sampled forward, removed as soon as they fired.

    A hook records the first *training* forward of its module after :meth:`arm` (evaluation
    forwards in between are skipped) and removes itself, so later micro-batches, recomputation
    under activation checkpointing and the steps between samples never call it.
    """

    def __init__(self, meter: CostMeter) -> None:
        self.modules: list[tuple[str, nn.Module]] = []
        self._meter = meter
        self._handles: dict[str, Any] = {}
        self._captured: dict[str, tuple[torch.Tensor, int]] = {}

    def arm(self) -> None:
        for name, module in self.modules:
            if name not in self._handles:
                self._handles[name] = module.register_forward_hook(partial(self._on_forward, name))

    def take(self) -> tuple[list[tuple[str, str, int]], torch.Tensor | None]:
        """``[(name, type, rows)]`` of the modules seen and their statistics stacked ``[n, 8]``;
        disarms."""
        for handle in self._handles.values():
            handle.remove()
        self._handles.clear()
        captured, self._captured = self._captured, {}
        seen = [(name, type(module).__name__, captured[name][1]) for name, module in self.modules
                if name in captured]
        if not seen:
            return [], None
        return seen, torch.stack([captured[name][0] for name, _, _ in seen])

    def _on_forward(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        if not module.training:
            return  # an evaluation forward: wait for a training one
        handle = self._handles.pop(name, None)
        if handle is not None:
            handle.remove()
        try:
            with self._meter, torch.no_grad():
                tensor = _first_float_tensor(output)
                if tensor is not None:
                    self._captured[name] = (activation_stats(tensor), rows_per_unit(tensor))
        except Exception:  # a statistic must never break the user's forward
            log.debug("tuimon: activation statistics of %s failed", name, exc_info=True)


class UpdateProbe:
    """Update/parameter ratios from strided element samples taken around ``optimizer.step()``.

    While :attr:`armed`, each optimizer's step pre-hook copies at most ``limit`` elements of each
    of its parameters that require grad (frozen ones are not expected to move) and its post-hook
    turns them into ``|dw| / |w|`` per parameter (NaN where ``|w|`` is 0: a ratio of a
    zero-initialised bias is undefined, not infinite). LBFGS's closure runs inside the step, so
    what is compared is the step's net effect. The hooks stay registered (``Monitor.step`` may run
    inside an optimizer hook, where torch forbids adding or removing one).
    """

    def __init__(self, limit: int, max_total: int, meter: CostMeter) -> None:
        self.armed = False
        self._limit = limit
        self._max_total = max_total
        self._meter = meter
        self._before: dict[int, tuple[list[torch.Tensor], list[int], torch.Tensor]] = {}
        self._ratios: dict[int, tuple[list[torch.Tensor], torch.Tensor]] = {}
        self._handles: list[Any] = []

    def watch(self, optimizer: torch.optim.Optimizer) -> None:
        self._handles += [optimizer.register_step_pre_hook(self._before_step),
                          optimizer.register_step_post_hook(self._after_step)]

    def take(self) -> list[tuple[list[torch.Tensor], torch.Tensor]]:
        """``[(params, ratios)]`` measured since armed, one entry per optimizer that stepped."""
        self.armed = False
        self._before.clear()
        taken, self._ratios = list(self._ratios.values()), {}
        return taken

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _samples(self, params: list[torch.Tensor], strides: list[int]) -> torch.Tensor:
        return torch.cat([flat_sample(p, s).float() for p, s in zip(params, strides, strict=True)])

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.armed:
            return
        try:
            with self._meter, torch.no_grad():
                params = [p for group in optimizer.param_groups for p in group["params"]
                          if p.requires_grad and p.is_floating_point() and p.numel() > 0]
                if not params:
                    return
                limit = max(16, min(self._limit, self._max_total // len(params)))
                strides = [sample_stride(p.numel(), limit) for p in params]
                self._before[id(optimizer)] = (params, strides, self._samples(params, strides))
        except Exception:  # e.g. parameters spread over several devices: no ratio for this one
            log.debug("tuimon: update-ratio probe failed before the step", exc_info=True)

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        entry = self._before.pop(id(optimizer), None)
        if entry is None:
            return
        try:
            with self._meter, torch.no_grad():
                params, strides, before = entry
                sizes = [math.ceil(p.numel() / s) for p, s in zip(params, strides, strict=True)]
                change = self._samples(params, strides) - before
                moved = torch.stack(torch._foreach_norm(list(change.split(sizes))))
                size = torch.stack(torch._foreach_norm(list(before.split(sizes))))
                ratios = torch.where(size > 0, moved / size, torch.full_like(size, math.nan))
                self._ratios[id(optimizer)] = (params, ratios)
        except Exception:
            log.debug("tuimon: update-ratio probe failed after the step", exc_info=True)


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
    :class:`~publisher.layer_sample.SampleLayout` that turns their host copies into a
    :class:`~publisher.layer_sample.LayerSample`; then :meth:`advance` moves the schedule on and
    arms the probes for the next sampled step. Without a model (zero-code runs) the model
    is found at a forward, as the invariant checker does (:class:`RootDiscovery`).
    """

    def __init__(
        self,
        config: StatsConfig,
        model: nn.Module | None,
        optimizers: Sequence[torch.optim.Optimizer],
        params: Callable[[], list[torch.Tensor]],
    ) -> None:
        self.config = config
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
            schedule = InvariantConfig(dense_steps=max(1, config.dense), check_every=config.every)
            adopt = partial(self._adopt, discovered=True)
            self._discovery = RootDiscovery(schedule, self._trained_ids, adopt)
            self._discovery.meter = self._meter
        for optimizer in optimizers:
            self.add_optimizer(optimizer)

    @property
    def seconds_spent(self) -> float:
        """Wall time spent measuring so far (hooks and assembly), the sampler's own cost."""
        return self._meter.spent_ns / 1e9

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

    def advance(self, step_time: float | None) -> None:
        """After each ``Monitor.step``: choose the next sampled step and arm the probes for it.

        ``step_time``: the typical step time in seconds (:class:`~publisher.budget.StepClock`), or
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
                self._updates.armed = True
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
            labels = {}
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
