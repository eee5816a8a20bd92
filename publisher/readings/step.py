"""One step as the training thread captured it: host numbers now, device ones later, the rest raw.

Reading a CUDA scalar (``.item()``) waits for the GPU; so a number on the CPU is read at once
(free) and one on an accelerator is set aside for the step's single asynchronous copy
(:mod:`publisher.measure.fetch`). What needs no reading at the step (the throughput, the
compute time's marks, memory) is kept raw and turned into metrics by the step worker
(:mod:`publisher.completion`): on the training thread, each call and each object touched costs
microseconds, since the step's kernels have just evicted the monitor's code and data from the
caches (``benchmarks/step_floor.py``: an empty Python call there takes ~3 us on a 2-core machine).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from numbers import Real
from typing import Any

import torch

from publisher.readings.batches import BatchPrint
from publisher.readings.compute_time import StepMarks
from publisher.wire.validation import MAX_NAME_CHARS


class StepReadings:
    """``metrics``: the numbers already on the host; ``waiting``: (name, device scalar) pairs;
    ``batches``: the fingerprints of the batches the step consumed; ``looks``: the looks at its loss
    calls that reached the host since the previous step, still to be read (on the CPU, measured).

    Raw, for the step worker: ``step``; ``at``, when it ended (``time.perf_counter``);
    ``previous_at``, when the previous step did (None for the first); ``tokens``, ``samples`` and
    ``data_time`` as given or measured; ``compute``, the marks of its own work; ``grads``, the
    gradient norms where measured (:class:`~publisher.stats.grad_norm.GradNorms`), ``layout`` and
    ``arrays`` a per-layer sample's; ``values``, the device numbers once on the host, in the order
    of ``waiting``; ``failed``, the parts that failed on the training thread, by name
    (:mod:`publisher.telemetry_errors`).
    """

    __slots__ = ("arrays", "at", "batches", "compute", "data_time", "failed", "grads", "layout", "looks",
                 "metrics", "previous_at", "samples", "step", "tokens", "values", "waiting")

    def __init__(self, step: int, at: float, previous_at: float | None) -> None:
        self.step = step
        self.at = at
        self.previous_at = previous_at
        self.metrics: dict[str, float] = {}
        self.waiting: list[tuple[str, torch.Tensor]] = []
        self.values: list[torch.Tensor] = []
        self.batches: tuple[BatchPrint, ...] = ()
        # publisher.patches.loss_look.PendingLook: a sibling layer, named here only by its type's name.
        self.looks: tuple[Any, ...] = ()
        self.tokens: int | None = None
        self.samples: int | None = None
        self.data_time: float | None = None
        self.compute: StepMarks | None = None
        # publisher.stats (GradNorms, SampleLayout): layers above this one, named by type only.
        self.grads: Any = None
        self.layout: Any = None
        self.arrays: list[torch.Tensor] = []
        self.failed: list[str] = []

    def add(self, name: str, value: torch.Tensor | float) -> None:
        """A number or a one-element tensor: read now if it is on the CPU, else set aside."""
        if not isinstance(value, torch.Tensor):
            self.metrics[name] = float(value)
        elif value.is_cpu:
            self.metrics[name] = float(value.item())  # a bool tensor's item is no number on the wire
        else:
            self.waiting.append((name, value))


#: A quiet step as the training thread queues it (``Monitor.step`` on a step where nothing is due;
#: the step worker reads it: :meth:`~publisher.completion.StepCompletion.complete_quiet`): step,
#: end time, the previous step's end time, loss (a float or None), learning rate (a float for one
#: parameter group, else each group's: :func:`group_rates`), tokens, samples, data time, compute
#: marks, batch fingerprints, the looks at its loss calls still to be read
#: (``publisher.patches.loss_look.PendingLook``), the caller's extras (:func:`host_numbers`, None
#: without). A tuple: on the training thread an object would cost a call.
QuietStep = tuple[int, float, float | None, float | None, float | tuple[float, ...], int | None, int | None,
                  float | None, StepMarks | None, tuple[BatchPrint, ...], tuple[Any, ...],
                  dict[str, float] | None]


def group_rates(groups: Sequence[dict[str, Any]]) -> tuple[float, ...] | None:
    """Each parameter group's learning rate, where every one is a plain float (what a step can read
    without touching a device); None otherwise (a capturable optimizer's rates are tensors).

    Most recipes for transformers train two groups (weight decay on the matrices, none on biases and
    norms: the Hugging Face Trainer, nanoGPT), so several groups are as usual as one.
    """
    rates = tuple([group["lr"] for group in groups])
    return rates if all(type(rate) is float for rate in rates) else None


def host_numbers(extra: dict[str, Any], room: int) -> dict[str, float]:
    """A step's extras (``Monitor.step(loss, accuracy=...)``) read as floats, where each is a real
    number (Python's or NumPy's) or a one-number tensor on the CPU (read now: the loop may change it
    in place), at most ``room`` of them, each name within the protocol's length; empty otherwise (a
    tensor on a device, which is copied with the step's other device numbers, or what the full step
    reports as an error: one extra breaks the rule, the whole step takes the full path).
    """
    if len(extra) > room:
        return {}
    numbers: dict[str, float] = {}
    for name, value in extra.items():
        if len(name) > MAX_NAME_CHARS:
            return {}
        kind = type(value)  # the usual types first: isinstance with torch.Tensor or Real costs ~300 ns
        if kind is float or kind is int:
            numbers[name] = float(value)
        elif kind is torch.Tensor or isinstance(value, torch.Tensor):
            if not value.is_cpu or value.numel() != 1:
                return {}
            numbers[name] = float(value.item())
        elif isinstance(value, Real):  # bool, NumPy's scalars
            numbers[name] = float(value)
        else:
            return {}
    return numbers


@functools.cache
def lr_names(groups: int) -> tuple[str, ...]:
    """The metrics that carry ``groups`` parameter groups' learning rates: ``lr``, ``lr/1``, ..."""
    return ("lr", *(f"lr/{group}" for group in range(1, groups)))


def step_loss(losses: Sequence[torch.Tensor], *, shares: bool = False) -> torch.Tensor | None:
    """One optimizer step's loss from the losses of its micro-batches (gradient accumulation, a
    closure evaluated several times), combined on their device without reading them: their mean,
    or their sum when each is already its ``shares`` of the step's loss (divided by the number of
    micro-batches, or normalised by the tokens of the whole accumulated batch). None when there
    were none."""
    if not losses:
        return None
    if len(losses) == 1:
        return losses[0]
    stacked = torch.stack([loss.reshape(()).float() for loss in losses])
    return stacked.sum() if shares else stacked.mean()
