"""Per-layer samples over time: what the layer panel draws as a heatmap of layers × samples.

A rank's ``metrics`` message carries, every few steps, a ``layers`` sample in columns (per
parameter: gradient norm, value norm, update ratio; per chosen module output: std, dead fraction,
NaN/Inf counts; see the wire protocol). This module keeps the last :data:`LAYER_SAMPLES` of them
per rank, as numbers per statistic and layer, and judges how far each value is from healthy, so
the panel can colour a cell and name the worst layers.

How "far from healthy" is judged, per statistic (0 healthy, 1 as bad as the colour scale goes):

* gradient norm: decades from the median layer of the same sample, compared per element (the
  norm over the square root of the parameter's size, so that a bias is not judged small beside a
  weight matrix): a layer 100x below or above the others is vanishing or exploding on its own
  (AutoTrainer, ICSE 2021, compares first and last layers' gradients the same way);
* update ratio |Δw|/|w|: decades from 1e-3, the rule of thumb of CS231n ("Neural Networks Part 3":
  updates about a thousandth of the weights);
* activation std: decades from 1 (the scale an initialisation such as He et al. 2015 keeps);
* dead fraction: the fraction itself (a unit that is zero for every input does not learn; the
  dead-ReLU rule of SageMaker Debugger);
* NaN/Inf: any non-finite value is as bad as it gets.

Every input is a peer's: malformed columns are skipped, never trusted, and memory is bounded
(:data:`LAYER_SAMPLES` samples of at most :data:`MAX_LAYERS` layers per rank).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from publisher.wire.protocol import ProtocolError, read_number

#: Samples kept per rank (the layer sampler sends one every few steps: hundreds of steps of history).
LAYER_SAMPLES = 240
#: Layers kept per sample (the publisher sends at most a configured number; this bounds a hostile one).
MAX_LAYERS = 512
#: Decades from healthy that colour a cell fully bad.
_DECADES_FOR_WORST = 2.0
#: How bad a layer must be to be named among the worst: half a decade from healthy, or a quarter of
#: its units dead.
STANDS_OUT = 0.25
#: The update ratio judged healthy (CS231n's rule of thumb).
HEALTHY_UPDATE_RATIO = 1e-3


@dataclass(frozen=True)
class LayerStatistic:
    """One statistic the panel can show: where it comes from in a sample and how it is judged."""

    key: str
    label: str
    #: How values are read from a sample: layer name -> value.
    read: Callable[[Mapping[str, Any]], dict[str, float]]
    #: How bad each value of one sample is, 0..1 (the sample's values, all layers, given, and the
    #: parameters' sizes in elements, where the sample said their shape).
    judge: Callable[[dict[str, float], Mapping[str, int]], dict[str, float]]
    #: Drawn on a logarithmic axis in the history chart.
    logarithmic: bool
    #: How the colour is judged, in a few words (the panel's legend).
    rule: str


def _column(table: Any, name: str) -> list[Any]:
    column = table.get(name) if isinstance(table, Mapping) else None
    return column if isinstance(column, list) else []


def _named(sample: Mapping[str, Any], table_name: str, *columns: str) -> dict[str, float]:
    """``{layer: sum of columns}`` from one table of a sample; a row with a missing value is left out."""
    table = sample.get(table_name)
    names = _column(table, "name")[:MAX_LAYERS]
    read = [_column(table, column) for column in columns]
    values: dict[str, float] = {}
    for index, name in enumerate(names):
        if not isinstance(name, str):
            continue
        parts = [_number_or_none(column[index]) if index < len(column) else None for column in read]
        if all(part is not None for part in parts):
            values[name] = float(sum(parts))  # type: ignore[arg-type]
    return values


def _number_or_none(value: Any) -> float | None:
    """A sample's number (the wire's ``"nan"``/``"inf"`` markers read as such), else None."""
    try:
        return read_number(value)
    except ProtocolError:
        return None


def _decades_from(target: float, value: float) -> float:
    if not math.isfinite(value):
        return 1.0
    if value <= 0:
        return 1.0  # nothing at all: a vanished gradient, a frozen weight, a dead output
    return min(1.0, abs(math.log10(value / target)) / _DECADES_FOR_WORST)


def _sizes(sample: Mapping[str, Any]) -> dict[str, int]:
    """Each parameter's number of elements, from the sample's ``shape`` column (where it is valid)."""
    table = sample.get("params")
    sizes: dict[str, int] = {}
    for name, shape in zip(_column(table, "name")[:MAX_LAYERS], _column(table, "shape"), strict=False):
        if isinstance(name, str) and isinstance(shape, list) and len(shape) <= 8 and all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape
        ):
            sizes[name] = math.prod(shape)
    return sizes


def _from_median(values: dict[str, float], sizes: Mapping[str, int]) -> dict[str, float]:
    per_element = {name: value / math.sqrt(sizes.get(name, 1)) for name, value in values.items()}
    finite = [v for v in per_element.values() if math.isfinite(v) and v > 0]
    if not finite:
        return dict.fromkeys(values, 1.0)
    median = statistics.median(finite)
    return {name: _decades_from(median, value) for name, value in per_element.items()}


def _from(target: float) -> Callable[[dict[str, float], Mapping[str, int]], dict[str, float]]:
    return lambda values, _: {name: _decades_from(target, value) for name, value in values.items()}


def _fraction(values: dict[str, float], _: Mapping[str, int]) -> dict[str, float]:
    return {name: min(1.0, max(0.0, v)) if math.isfinite(v) else 1.0 for name, v in values.items()}


def _any(values: dict[str, float], _: Mapping[str, int]) -> dict[str, float]:
    return {name: 0.0 if v == 0 else 1.0 for name, v in values.items()}


def _nonfinite(sample: Mapping[str, Any]) -> dict[str, float]:
    """NaN/Inf counts of module outputs, and 1 for a parameter whose gradient or value is not finite."""
    counts = _named(sample, "modules", "nan", "inf")
    for column in ("grad_norm", "param_norm"):
        for name, value in _named(sample, "params", column).items():
            counts[name] = max(counts.get(name, 0.0), 0.0 if math.isfinite(value) else 1.0)
    return counts


STATISTICS: tuple[LayerStatistic, ...] = (
    LayerStatistic("grad_norm", "gradient norm", lambda s: _named(s, "params", "grad_norm"), _from_median,
                   True, "decades from the median layer"),
    LayerStatistic("update_ratio", "update ratio |Δw|/|w|", lambda s: _named(s, "params", "update_ratio"),
                   _from(HEALTHY_UPDATE_RATIO), True, "decades from 1e-3"),
    LayerStatistic("act_std", "activation std", lambda s: _named(s, "modules", "std"), _from(1.0),
                   True, "decades from 1"),
    LayerStatistic("dead_frac", "dead fraction", lambda s: _named(s, "modules", "dead_frac"), _fraction,
                   False, "share of units never active"),
    LayerStatistic("nonfinite", "NaN/Inf", _nonfinite, _any, False, "any NaN or Inf"),
)
STATISTIC_KEYS = tuple(statistic.key for statistic in STATISTICS)
_BY_KEY = {statistic.key: statistic for statistic in STATISTICS}


#: The statistic that shows what an event of each kind is about (the others open on grad_norm).
STATISTIC_OF_KIND = {
    "vanishing_gradient": "grad_norm", "grad_explosion": "grad_norm", "missing_gradient": "grad_norm",
    "nonfinite_grad": "nonfinite", "nonfinite_param": "nonfinite", "nonfinite_loss": "nonfinite",
    "dead_activations": "dead_frac", "update_ratio": "update_ratio", "optimizer_noop": "update_ratio",
    "frozen_param_changed": "update_ratio",
}


def statistic(key: str) -> LayerStatistic:
    return _BY_KEY[key]


def statistic_for(kind: str) -> str:
    """The statistic key to open the layer heatmap on for an event of ``kind``."""
    return STATISTIC_OF_KIND.get(kind, STATISTIC_KEYS[0])


@dataclass(frozen=True)
class LayerSample:
    """One sample: its step, per statistic key ``{layer: value}``, and the parameters' sizes."""

    step: int
    values: Mapping[str, Mapping[str, float]]
    sizes: Mapping[str, int]


@dataclass(frozen=True)
class LayerMatrix:
    """What the heatmap draws for one statistic: layers (rows, in model order), the samples'
    steps (columns, oldest first), and per cell its value and badness (None: not in that sample)."""

    statistic: LayerStatistic
    layers: tuple[str, ...]
    steps: tuple[int, ...]
    values: tuple[tuple[float | None, ...], ...]
    badness: tuple[tuple[float | None, ...], ...]

    def worst(self, count: int, *, at_least: float = STANDS_OUT) -> list[tuple[str, float, float]]:
        """The ``count`` layers worst in the latest sample that has them, of those at least
        ``at_least`` bad: (layer, value, badness), worst first."""
        latest: list[tuple[str, float, float]] = []
        for row, layer in enumerate(self.layers):
            pairs = zip(self.values[row], self.badness[row], strict=True)
            cells = [(v, b) for v, b in pairs if b is not None]
            if cells:
                value, bad = cells[-1]
                latest.append((layer, value if value is not None else math.nan, bad))
        latest.sort(key=lambda item: -item[2])
        return [item for item in latest if item[2] >= at_least and item[2] > 0][:count]

    def history(self, layer: str) -> tuple[list[int], list[float]]:
        """One layer's (steps, values) over the samples that have it."""
        if layer not in self.layers:
            return [], []
        row = self.values[self.layers.index(layer)]
        kept = [(step, value) for step, value in zip(self.steps, row, strict=True) if value is not None]
        return [step for step, _ in kept], [value for _, value in kept]


class LayerHistory:
    """The last :data:`LAYER_SAMPLES` layer samples of one rank."""

    def __init__(self, capacity: int = LAYER_SAMPLES) -> None:
        self._samples: deque[LayerSample] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, step: int, sample: Mapping[str, Any]) -> bool:
        """Keep ``sample`` (a message's ``layers`` object); False when it held nothing readable."""
        values = {stat.key: stat.read(sample) for stat in STATISTICS}
        if not any(values.values()):
            return False
        self._samples.append(LayerSample(step, values, _sizes(sample)))
        return True

    def matrix(self, key: str, last: int | None = None) -> LayerMatrix:
        """The heatmap of statistic ``key`` over the last ``last`` samples (all when None)."""
        stat = statistic(key)
        samples = list(self._samples)[-last:] if last else list(self._samples)
        judged = [(sample, stat.judge(dict(sample.values.get(key, {})), sample.sizes)) for sample in samples]
        layers = _in_order_seen(sample.values.get(key, {}) for sample in samples)
        values = tuple(tuple(s.values.get(key, {}).get(layer) for s, _ in judged) for layer in layers)
        badness = tuple(tuple(bad.get(layer) for _, bad in judged) for layer in layers)
        return LayerMatrix(stat, tuple(layers), tuple(s.step for s in samples), values, badness)


def _in_order_seen(tables: Iterable[Mapping[str, float]]) -> list[str]:
    """Layer names in the order they first appear (the model's order, as the sampler lists it)."""
    seen: dict[str, None] = {}
    for table in tables:
        for name in table:
            if name not in seen and len(seen) < MAX_LAYERS:
                seen[name] = None
    return list(seen)


def named_layers(details: Mapping[str, Any], known: Sequence[str]) -> list[str]:
    """The layers an event's details name (``layer``/``layers``/``first_layer``/``params``/``modules``,
    as a list, a mapping or one name) that the history knows, in the details' order."""
    named: list[str] = []
    for key in ("layer", "layers", "first_layer", "params", "modules"):
        value = details.get(key)
        if isinstance(value, str):
            value = [value]
        if isinstance(value, Mapping | list):
            named += [name for name in value if isinstance(name, str) and name in known and name not in named]
    return named
