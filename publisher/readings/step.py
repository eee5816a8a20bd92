"""One step's numbers as the training thread reads them: host numbers now, device ones later.

Reading a CUDA scalar (``.item()``) waits for the GPU; so a number on the CPU is read at once
(free) and one on an accelerator is set aside for the step's single asynchronous copy
(:mod:`publisher.measure.fetch`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from publisher.readings.batches import BatchPrint


class StepReadings:
    """``metrics``: the numbers already on the host; ``waiting``: (name, device scalar) pairs;
    ``batches``: the fingerprints of the batches the step consumed; ``looks``: the looks at its loss
    calls that reached the host since the previous step."""

    __slots__ = ("batches", "looks", "metrics", "waiting")

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}
        self.waiting: list[tuple[str, torch.Tensor]] = []
        self.batches: tuple[BatchPrint, ...] = ()
        # publisher.patches.loss_look.LossLook: a sibling layer, named here only by its type's name.
        self.looks: tuple[Any, ...] = ()

    def add(self, name: str, value: torch.Tensor | float) -> None:
        """A number or a one-element tensor: read now if it is on the CPU, else set aside."""
        if not isinstance(value, torch.Tensor):
            self.metrics[name] = float(value)
        elif value.is_cpu:
            self.metrics[name] = value.item()
        else:
            self.waiting.append((name, value))


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
