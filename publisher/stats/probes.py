"""The device-side probes of a layer sample: module output statistics and update ratios.

Both run inside the user's training through hooks that exist only while a sample is being taken:
forward hooks on the chosen modules (eight statistics of one training forward's output), and the
optimizer's step pre/post hooks (``|dw| / |w|`` on a bounded strided sample of each parameter).
Their results stay on the device until the step's one transfer to the host.
"""

from __future__ import annotations

import logging
import math
from functools import partial
from typing import Any

import torch
from torch import nn

from publisher.measure.budget import CostMeter
from publisher.measure.step_hooks import NEVER, StepHooks, hooks_on
from publisher.measure.tensors import flat_sample, readable, sample_stride

log = logging.getLogger(__name__)


def activation_stats(output: torch.Tensor) -> torch.Tensor:
    """The :data:`~publisher.stats.layer_sample.ACTIVATION_FIELDS` of one tensor.

    A float32 vector on the tensor's device.

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
    """The tensor a module returned, or the first floating tensor of a tuple/list/dict it returned,
    where its values can be read (:func:`~publisher.measure.tensors.readable`) and it has any."""
    if isinstance(value, torch.Tensor):
        return value if value.is_floating_point() and value.numel() > 0 and readable(value) else None
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

    Once :meth:`arm` ed, before each optimizer's step it copies at most ``limit`` elements of each
    of its parameters that require grad (frozen ones are not expected to move) and after it turns
    them into ``|dw| / |w|`` per parameter (NaN where ``|w|`` is 0: a ratio of a zero-initialised
    bias is undefined, not infinite). LBFGS's closure runs inside the step, so what is compared is
    the step's net effect. It is one of the parts of the optimizers' shared step hooks
    (:mod:`publisher.measure.step_hooks`), called only while armed.
    """

    def __init__(self, limit: int, max_total: int, meter: CostMeter) -> None:
        self.armed = False
        self._limit = limit
        self._max_total = max_total
        self._meter = meter
        self._before: dict[int, tuple[list[torch.Tensor], list[int], torch.Tensor]] = {}
        self._ratios: dict[int, tuple[list[torch.Tensor], torch.Tensor]] = {}
        self._hooks: list[StepHooks] = []

    def watch(self, optimizer: torch.optim.Optimizer) -> None:
        self._hooks.append(hooks_on(optimizer).add(self))

    def arm(self) -> None:
        """Measure the next step of each optimizer (until :meth:`take`)."""
        self.armed = True
        for hooks in self._hooks:
            hooks.wake(self)

    def take(self) -> list[tuple[list[torch.Tensor], torch.Tensor]]:
        """``[(params, ratios)]`` measured since armed, one entry per optimizer that stepped."""
        self.armed = False
        self._before.clear()
        taken, self._ratios = list(self._ratios.values()), {}
        return taken

    def close(self) -> None:
        for hooks in self._hooks:
            hooks.remove(self)
        self._hooks.clear()

    def _samples(self, params: list[torch.Tensor], strides: list[int]) -> torch.Tensor:
        return torch.cat([flat_sample(p, s).float() for p, s in zip(params, strides, strict=True)])

    def before_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict, index: int) -> None:
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

    def after_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict, index: int) -> int:
        entry = self._before.pop(id(optimizer), None)
        if entry is not None:
            self._ratios_of(optimizer, entry)
        return index + 1 if self.armed else NEVER

    def _ratios_of(self, optimizer: torch.optim.Optimizer,
                   entry: tuple[list[torch.Tensor], list[int], torch.Tensor]) -> None:
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
