"""One per-layer sample on the host: what the detectors read and the ``layers`` payload of a message.

Kept apart from the device-side measurement (:mod:`publisher.stats.sampler`) so that readers of a
sample (the detectors) need neither torch nor the sampler: a sample is plain numbers, one
:class:`ParamStat` per trained parameter and one :class:`ModuleStat` per measured module.
:class:`SampleLayout` is the bridge: the host-side description of which device number belongs to
which parameter or module, turned into a :class:`LayerSample` once the numbers have arrived.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from publisher.wire.protocol import wire_number

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

#: The statistics of a module's output, as :func:`~publisher.stats.probes.activation_stats` orders them.
ACTIVATION_FIELDS = ("min", "max", "mean", "std", "nan", "inf", "zero_frac", "dead_frac")
#: The per-parameter numbers of a sample.
PARAM_FIELDS = ("grad_norm", "param_norm", "update_ratio")


@dataclass(frozen=True, slots=True)
class ParamStat:
    """One trained parameter in a sample. None: not measured (no gradient, no step, zero weights)."""

    name: str
    shape: tuple[int, ...]
    lr: float | None
    grad_norm: float | None
    param_norm: float | None = None
    update_ratio: float | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class ModuleStat:
    """Statistics of one module's output in a training forward of a sampled step."""

    name: str
    type: str
    values: dict[str, float]  # ACTIVATION_FIELDS -> value
    rows: int  # values per unit behind ``dead_frac`` (batch x positions)


@dataclass(frozen=True)
class LayerSample:
    """What one sample found, on the host. ``complete`` False: gradients only (a step whose
    gradient norm was not finite, sampled to say where)."""

    params: tuple[ParamStat, ...]
    modules: tuple[ModuleStat, ...] = ()
    complete: bool = True

    def nonfinite(self, field: str) -> list[str]:
        """Names of the parameters whose ``field`` (``grad_norm``, ``param_norm``) is NaN or Inf."""
        names = []
        for p in self.params:
            value = getattr(p, field)
            if value is not None and not math.isfinite(value):
                names.append(p.name)
        return names

    def totals(self) -> dict[str, float]:
        """Global ``param_norm`` and ``update_ratio`` (|dw| / |w| of the whole model, estimated from
        each parameter's ratio weighted by its norm), as extra step metrics."""
        totals: dict[str, float] = {}
        norms = [p.param_norm for p in self.params if p.param_norm is not None]
        if norms:
            totals["param_norm"] = math.sqrt(math.fsum(n * n for n in norms))
        moved = [(p.update_ratio * p.param_norm, p.param_norm) for p in self.params
                 if p.update_ratio is not None and p.param_norm is not None and math.isfinite(p.update_ratio)]
        weight = math.fsum(w * w for _, w in moved)
        if weight > 0:
            totals["update_ratio"] = math.sqrt(math.fsum(d * d for d, _ in moved) / weight)
        return totals

    def payload(self, limit: int) -> dict[str, Any]:
        """The wire form: the ``layers`` field of a ``metrics`` message (docs/protocol.md).

        Columns rather than one object per layer (the names once, then one list per statistic):
        a third of the bytes, and a sample of a big model stays a few kilobytes. At most ``limit``
        parameters and ``limit`` modules, spread evenly over the model (first and last kept).
        """
        params, modules = spread(self.params, limit), spread(self.modules, limit)
        body: dict[str, Any] = {
            "complete": self.complete,
            "params": {
                "name": [p.name for p in params],
                "shape": [list(p.shape) for p in params],
                **{field: [wire_number(getattr(p, field)) for p in params] for field in PARAM_FIELDS},
            },
            "modules": {
                "name": [m.name for m in modules],
                "type": [m.type for m in modules],
                "rows": [m.rows for m in modules],
                **{field: [wire_number(m.values[field]) for m in modules] for field in ACTIVATION_FIELDS},
            },
        }
        dropped = len(self.params) - len(params) + len(self.modules) - len(modules)
        if dropped:
            body["truncated"] = dropped
        return body


def spread(items: Sequence[T], limit: int) -> list[T]:
    """At most ``limit`` of ``items``, evenly spaced, the first and the last always among them."""
    if len(items) <= limit:
        return list(items)
    if limit == 1:
        return [items[0]]
    return [items[round(i * (len(items) - 1) / (limit - 1))] for i in range(limit)]


@dataclass
class SampleLayout:
    """Host-side description of a sample's device tensors: which parameter or module each number
    belongs to. ``updated``: per optimizer that stepped, the positions of its parameters."""

    names: list[str]
    shapes: list[tuple[int, ...]]
    lrs: list[float | None]
    has_grads: bool
    grad_indices: list[int] | None
    floating: list[int] = field(default_factory=list)
    updated: list[list[int]] = field(default_factory=list)
    modules: list[tuple[str, str, int]] = field(default_factory=list)
    complete: bool = True

    def decode(self, grad_norms: torch.Tensor | None, parts: Sequence[torch.Tensor]) -> LayerSample:
        """The sample from host copies: the step's per-parameter gradient norms and the tensors
        ``LayerSampler.collect`` returned, in order."""
        n = len(self.names)
        grad: list[float | None] = [None] * n
        if self.has_grads and grad_norms is not None:
            positions = range(n) if self.grad_indices is None else self.grad_indices
            for i, value in zip(positions, grad_norms.tolist(), strict=True):
                grad[i] = value
        norm: list[float | None] = [None] * n
        ratio: list[float | None] = [None] * n
        rest = iter(parts)
        if self.floating:
            for i, value in zip(self.floating, next(rest).tolist(), strict=True):
                norm[i] = value
        for positions in self.updated:
            for i, value in zip(positions, next(rest).tolist(), strict=True):
                if i >= 0 and not math.isnan(value):
                    ratio[i] = value
        modules: list[ModuleStat] = []
        if self.modules:
            flat = next(rest).reshape(-1).tolist()
            width = len(ACTIVATION_FIELDS)
            for k, (name, kind, rows) in enumerate(self.modules):
                values = dict(zip(ACTIVATION_FIELDS, flat[k * width:(k + 1) * width], strict=True))
                modules.append(ModuleStat(name, kind, values, rows))
        params = tuple(ParamStat(self.names[i], self.shapes[i], self.lrs[i], grad[i], norm[i], ratio[i])
                       for i in range(n))
        return LayerSample(params, tuple(modules), self.complete)
