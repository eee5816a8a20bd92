"""Gradient norms: the global one every step reports, and the per-parameter ones a sample reads.

One fused ``_foreach_norm`` over every gradient gives both at once, on the device; nothing here
reads a device tensor (the values reach the host with the step's other numbers,
:mod:`publisher.measure.fetch`). On a CPU reading every gradient costs real time (about 1 ms for
2M parameters), so outside layer samples the norm keeps to a share of the step time
(:class:`BudgetedGradNorm`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from publisher.measure.budget import CostBudget, StepClock
from publisher.measure.tensors import stack_on


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


class BudgetedGradNorm:
    """The gradient norms on as many steps as ``budget`` (a share of the step time) allows.

    Their cost on the calling thread is measured each time
    (:class:`~publisher.measure.budget.CostBudget`), and the next computation waits as many steps
    as keep the average within the share. On a GPU the kernels are only queued, so the cost is a
    few microseconds and the norm is there on every step.
    """

    def __init__(self, budget: float, clock: StepClock) -> None:
        self._normer = GradNormer()
        self._budget = CostBudget(budget, what="grad_norm_budget")
        self._clock = clock
        self._wait = 0  # steps to skip before the next computation
        self._unsettled: float | None = None  # the latest computation's cost, until :meth:`settle`
        #: The step :meth:`due` last decided on (by ``after``), and whether it measured there.
        self._decided: tuple[float | None, bool] | None = None

    def now(self, params: Sequence[torch.Tensor]) -> GradNorms | None:
        """The norms whatever the budget (a sampled step reads them anyway)."""
        return self._normer(params)

    def idle_steps(self) -> int:
        """Coming :meth:`due` calls that will compute nothing."""
        return max(self._wait, 0)

    def skip(self, steps: int) -> None:
        """``steps`` calls of :meth:`due` that were not made (the Monitor's quiet steps)."""
        self._wait -= steps

    def due(self, params: Callable[[], Sequence[torch.Tensor]], after: float | None) -> GradNorms | None:
        """The norms of ``params()`` if the budget allows them on this step, else None (and
        ``params`` is not even called: the common case costs a few comparisons). The step is
        told by ``after``, when the one before it was recorded (None before the first): unlike a
        step number a caller gives, it differs from step to step.

        One decision per step: a second call for the same step (a second optimizer's check
        before its own update, as in a GAN) gets the same answer, measured afresh (its gradients
        may have changed since), instead of spending the next step's turn: two optimizers used
        to halve the wait, and the second one's None replaced the first one's norms, so a GAN's
        steps lost their ``grad_norm`` wherever the budget left a gap."""
        decided = self._decided
        if decided is not None and decided[0] == after:
            measuring = decided[1]
        else:
            measuring = self._wait <= 0
            self._decided = (after, measuring)
            if not measuring:
                self._wait -= 1
        if not measuring:
            return None
        started = time.perf_counter()
        norms = self._normer(params())
        cost = time.perf_counter() - started
        self.settle(0.0)  # an earlier computation whose step was never recorded
        self._unsettled = cost
        self._wait = self._budget.gap(self._clock.seconds) - 1  # without the step's share, until settled
        return norms

    def settle(self, step_cost: float) -> None:
        """Charge the latest computation with ``step_cost``, the seconds its step took to record
        where that step could otherwise have been quiet (0.0 where every step is recorded in full
        anyway, as with a loss on a GPU), and space the next one accordingly. A step that carries
        the norm takes the Monitor's full path where the others take its quiet one
        (``Monitor.step``): on a ~1 ms CPU step that costs about as much again as the norm itself,
        and a budget that counted the norm alone spent twice its share (docs/benchmarks.md)."""
        cost, self._unsettled = self._unsettled, None
        if cost is None:
            return
        self._budget.charge(cost + step_cost)
        self._wait = self._budget.gap(self._clock.seconds) - 1
