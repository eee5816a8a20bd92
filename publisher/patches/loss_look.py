"""What one look at a loss call measures: a few numbers about its input and target, and the labels.

On an accelerator a look is queued on the tensors' own device (a handful of reductions, and for
class-index targets one ``index_add_`` of ones into a histogram, the way the label prior is
counted) and all of it comes back to the host in one non-blocking copy, read when it has landed
(its CUDA event is polled, never waited on). On the CPU the same reductions would run on the
training thread, inside the loss call: a dozen small torch operations (about twenty, 0.35-0.4 ms
on this project's busy 2-core machine, before the device computed only extremes).
There the look keeps the tensors instead (the input's sampled rows, copied only when they are a
sample of a bigger tensor, and the target by reference) and the step worker measures them when it
reads the look, with the same code; a target refilled in place before then (a hand-made loop
that reuses one label buffer) would be counted with its new labels.

The verdicts are the detectors' (:mod:`publisher.detectors.loss_inputs`,
:mod:`publisher.detectors.labels`); here is only what they need, and the user's line that made the
call, read from the caller's frames at the look (a few frame hops, only on looked-at calls), and
the operation that made the input, read from its autograd graph (``SigmoidBackward0``: the input
is a sigmoid's output), through the operations that only move values (views, copies).

The numbers of a tensor read along its distribution dimension (the class dimension, 1, of
``cross_entropy``/``nll_loss``; the last one of ``kl_div``): its smallest and largest value, the
largest distance of a row's sum from 1 (probabilities have 0) and of a row's ``logsumexp`` from 0
(log-probabilities have 0; measured only for the inputs of ``nll_loss`` and ``kl_div``, which take
log-probabilities: it is the dearest of the four). A loss that reads its input element by element
(``binary_cross_entropy_with_logits``) has no rows: those two are NaN, as is one not measured.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from publisher.measure.tensors import readable

#: Class counts up to which the labels of a class-index target are counted (a histogram of C + 1
#: numbers comes back with the look; a vocabulary of 50,000 tokens is not a label set worth it).
MAX_COUNTED_CLASSES = 4096
#: Losses whose input is log-probabilities: their rows' logsumexp is read too.
_LOG_INPUTS = ("nll_loss", "kl_div")
#: Values of a tensor a look reads at most: evenly spaced rows (whole rows, so that their sums mean
#: something) of a bigger one. A language model's (tokens, 50,000) logits in bf16 are read one
#: row in each stride, not copied whole to float32 (gigabytes, on the device that trains).
SAMPLED_VALUES = 1 << 16
#: Autograd nodes that only move or copy values: the input's maker is looked for behind them.
_PASS_THROUGH = frozenset({"View", "UnsafeView", "Reshape", "Squeeze", "Unsqueeze", "Permute", "Transpose",
                           "T", "Expand", "Clone", "ToCopy", "Select", "Slice", "Alias"})
#: Frames under these folders are torch's or tuimon's own, not the user's call.
_OWN_FOLDERS = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True, slots=True)
class TensorStats:
    """A tensor as a loss saw it: shape, dtype and its four numbers (see the module's docstring)."""

    shape: tuple[int, ...]
    dtype: str
    min: float
    max: float
    row_sum_error: float  # NaN: no rows
    row_logsumexp: float  # NaN: no rows

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def probabilities(self, tolerance: float = 1e-3) -> bool:
        """Every value in [0, 1] and, where there are rows, every row summing to 1."""
        in_unit = self.min >= 0.0 and self.max <= 1.0
        return in_unit and (math.isnan(self.row_sum_error) or self.row_sum_error <= tolerance)


@dataclass(frozen=True, slots=True)
class LossLook:
    """One looked-at call of a watched loss, on the host.

    ``classes``: C, the class dimension's size, for ``cross_entropy``/``nll_loss`` (0 otherwise);
    ``labels``: for class-index targets of at most :data:`MAX_COUNTED_CLASSES` classes, the count
    of each class in the call's target (index C: labels outside [0, C), such as ``ignore_index``),
    else None; ``per_example``: the target holds one label per example (shape (N,)), not one per
    token or pixel. ``site``: ``file:line`` of the user's call; ``made_by``: the operation that made
    the input (its autograd node's name less ``Backward0``), None when unknown.
    """

    function: str
    input: TensorStats
    target: TensorStats | None  # None: class indices (or not a tensor)
    target_shape: tuple[int, ...]
    target_dtype: str
    log_target: bool
    classes: int
    labels: tuple[int, ...] | None
    per_example: bool
    site: str
    made_by: str | None = None  # the autograd operation that made the input ("Sigmoid", "Softmax")


class PendingLook:
    """A look whose numbers are on their way to the host (:meth:`landed` says when to read them),
    or, on the CPU, whose tensors wait to be measured by :meth:`read`."""

    __slots__ = ("_event", "_host", "_meta", "_tensors", "cost_s")

    def __init__(self, meta: dict[str, Any], values: torch.Tensor | None = None,
                 tensors: tuple[torch.Tensor, Any] | None = None) -> None:
        self._meta = meta
        #: Seconds the look took on the training thread (its reading on the host adds to them).
        self.cost_s = 0.0
        self._event: Any = None
        self._tensors = tensors  # (input rows, target): measured when read
        self._host: torch.Tensor | None = None
        if values is None:
            return
        if values.device.type == "cuda":
            self._host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            self._host.copy_(values, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = values.cpu()

    @property
    def classes(self) -> int:
        """C of a ``cross_entropy``/``nll_loss`` call (0 for the others)."""
        return int(self._meta["classes"])

    def landed(self) -> bool:
        return self._event is None or bool(self._event.query())

    def read(self) -> LossLook:
        """The look on the host (call once :meth:`landed` says so; on the CPU, measured here)."""
        meta = self._meta
        host = self._host if self._tensors is None else _measure(meta, *self._tensors)
        assert host is not None
        values = iter(host.tolist())
        row_dim = _row_dim(meta)
        input_stats = _stats(values, meta["input_shape"], meta["input_dtype"], row_dim,
                             meta["function"] in _LOG_INPUTS)
        target = _stats(values, meta["target_shape"], meta["target_dtype"], row_dim, False) \
            if meta["target_stats"] else None
        labels = tuple(int(v) for v in values) if meta["counted"] else None
        return LossLook(meta["function"], input_stats, target, meta["target_shape"], meta["target_dtype"],
                        meta["log_target"], meta["classes"], labels, meta["per_example"], meta["site"],
                        meta["made_by"])


def _stats(values: Iterator[float], shape: tuple[int, ...], dtype: str, row_dim: int | None,
           logsumexp: bool) -> TensorStats:
    """A tensor's :class:`TensorStats` from the next of its look's numbers, in :func:`_extremes`'
    order: the distances of the module's docstring are taken here, on the host, from the extremes
    of the row sums and logsumexps (a distance from a point is largest at one of the extremes)."""
    low, high = next(values), next(values)
    rows = row_dim is not None and len(shape) > 0
    sums = _farthest(next(values), next(values), 1.0) if rows else math.nan
    lse = _farthest(next(values), next(values), 0.0) if rows and logsumexp else math.nan
    return TensorStats(shape, dtype, low, high, sums, lse)


def _farthest(low: float, high: float, centre: float) -> float:
    """The largest distance from ``centre`` of values between ``low`` and ``high`` (NaN if either is)."""
    if math.isnan(low) or math.isnan(high):
        return math.nan
    return max(abs(low - centre), abs(high - centre))


def look(function: str, input: torch.Tensor, target: Any, log_target: bool) -> PendingLook:
    """Queue the look's numbers on the input's device and start their copy to the host; on the CPU,
    keep its tensors for :meth:`PendingLook.read` to measure. ``input`` must be
    :func:`~publisher.measure.tensors.readable` (the caller's check)."""
    classes = input.shape[1] if function in ("cross_entropy", "nll_loss") and input.ndim >= 2 else 0
    is_tensor = isinstance(target, torch.Tensor)
    measured = is_tensor and readable(target)  # a sparse or complex target is described, not measured
    float_target = measured and target.is_floating_point()
    counted = measured and not float_target and 2 <= classes <= MAX_COUNTED_CLASSES
    meta = {
        "function": function, "input_shape": tuple(input.shape),
        "input_dtype": str(input.dtype).removeprefix("torch."),
        "target_shape": tuple(target.shape) if is_tensor else (),
        "target_dtype": str(target.dtype).removeprefix("torch.") if is_tensor else type(target).__name__,
        "target_stats": float_target, "log_target": log_target, "classes": classes, "counted": counted,
        "per_example": is_tensor and target.ndim == 1, "site": call_site(), "made_by": maker(input),
    }
    rows = _rows(input.detach())
    kept_target = target.detach() if float_target or counted else None
    if rows.device.type == "cpu":
        # A sample of a bigger input is copied, so that the look does not keep all of it alive.
        kept_rows = rows.clone() if rows.numel() < input.numel() else rows
        return PendingLook(meta, tensors=(kept_rows, kept_target))
    return PendingLook(meta, values=_measure(meta, rows, kept_target))


def _measure(meta: dict[str, Any], rows: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
    """A look's numbers as one float32 tensor on the input's device: the input's extremes
    (:func:`_extremes`), the target's where it holds floats, then the label counts where they are
    counted; :meth:`PendingLook.read` turns them into the module docstring's numbers on the host.
    A classifier's look is thirteen small operations (it was twenty-three, with the distances taken
    on the device)."""
    row_dim = _row_dim(meta)
    numbers = _extremes(rows, row_dim, meta["function"] in _LOG_INPUTS)
    if meta["target_stats"] and target is not None:
        numbers += _extremes(_rows(target), row_dim, False)
    values = torch.stack(numbers)
    if meta["counted"] and target is not None:
        return torch.cat([values, _histogram(target, meta["classes"])])
    return values


def _row_dim(meta: dict[str, Any]) -> int | None:
    """The distribution dimension a look reads rows along: the class dimension of
    ``cross_entropy``/``nll_loss``, the last of ``kl_div``; None for a loss that reads its input
    element by element (``binary_cross_entropy_with_logits``)."""
    if meta["function"] == "binary_cross_entropy_with_logits":
        return None
    return 1 if meta["classes"] else -1


def _extremes(tensor: torch.Tensor, row_dim: int | None, logsumexp: bool) -> list[torch.Tensor]:
    """A tensor's smallest and largest value and, where it has rows, the smallest and largest row
    sum and (when asked) row logsumexp, as float32 scalars on its device; NaN for each of them where
    there is no value to take them of (an empty selection: a masked loss over a batch with no
    labelled row)."""
    values = tensor.float()
    rows = row_dim is not None and values.ndim > 0
    if values.numel() == 0:
        return list(values.new_full((2 + 2 * rows + 2 * (rows and logsumexp),), math.nan).unbind())
    numbers = list(values.aminmax())
    if row_dim is None or not rows:
        return numbers
    numbers += values.sum(row_dim).aminmax()
    if logsumexp:
        numbers += values.logsumexp(row_dim).aminmax()
    return numbers


def _rows(tensor: torch.Tensor) -> torch.Tensor:
    """At most :data:`SAMPLED_VALUES` values of ``tensor``: evenly spaced entries of its first
    dimension (a view, nothing copied)."""
    if tensor.ndim == 0 or tensor.numel() <= SAMPLED_VALUES:
        return tensor
    per_entry = tensor.numel() // max(tensor.shape[0], 1)
    keep = max(1, SAMPLED_VALUES // max(per_entry, 1))
    return tensor[:: -(-tensor.shape[0] // keep)]


def _histogram(target: torch.Tensor, classes: int) -> torch.Tensor:
    """How many labels of each class, and (last) outside [0, C), in float32. Labels are clamped to
    [-1, C] and -1 taken modulo C + 1, so that every outside label lands at index C. Not
    ``bincount``, nor a boolean mask: both need the result's size on the host, a device
    synchronisation."""
    labels = target.reshape(-1).long().clamp(-1, classes).remainder(classes + 1)
    counts = torch.zeros(classes + 1, device=labels.device)
    return counts.index_add_(0, labels, torch.ones(labels.shape, device=labels.device))


def maker(tensor: torch.Tensor, hops: int = 6) -> str | None:
    """The operation that made ``tensor``, seen through views and copies (``Sigmoid`` for
    ``model(x).sigmoid().squeeze(1)``); None for a leaf or past ``hops`` nodes. Reads Python
    attributes of the autograd graph only: no device work."""
    node = tensor.grad_fn
    for _ in range(hops):
        if node is None:
            return None
        name = node.name().rpartition("Backward")[0] or node.name()
        if name not in _PASS_THROUGH:
            return name
        node = next((fn for fn, _ in node.next_functions if fn is not None), None)
    return None


def call_site() -> str:
    """``file:line`` of the innermost frame outside torch and tuimon (the user's loss call)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_OWN_FOLDERS):
        frame = frame.f_back  # type: ignore[assignment]
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"
