"""Every trained parameter receives a gradient (``params_receive_grads``).

A parameter an optimizer owns that requires grad must receive a non-zero gradient within the first
``grad_window`` steps of its optimizer, counted from the step where it first requires grad (so a
layer unfrozen later gets its own window). Catches ``no_grad``/``detach`` cutting a subgraph off,
gates that zero everything, branches never used. Names the parameters.

How: after each step, for the parameters still waiting, one ``_foreach_norm(inf)`` over their
dense gradients (sparse gradients: the norm of their values, so embedding rows missing from a
batch do not matter). A parameter counts as served once any step showed a non-zero gradient, so a
branch used every other step is fine. Runs every step while some parameter is inside its window,
otherwise only on sampled steps (to see newly trainable parameters and late arrivals); once every
parameter has been served the per-step cost is nil. The post-hook is used rather than the pre-hook
because closure optimizers (LBFGS) compute their gradients inside ``step()``.
"""

from __future__ import annotations

import math
from functools import partial

import torch

from publisher.detectors.base import name_list
from publisher.invariants.config import InvariantConfig
from publisher.invariants.core import PendingResults, StatusBoard, WatchedOptimizer
from publisher.measure.budget import Schedule
from publisher.measure.check import Check
from publisher.measure.tensors import ParamNamer, stack_on

RECEIVE = "params_receive_grads"


class ArrivalCheck(Check):
    """Which of one optimizer's trainable parameters have received a non-zero gradient yet."""

    names = (RECEIVE,)

    def __init__(self, board: StatusBoard, config: InvariantConfig, watched: WatchedOptimizer,
                 schedule: Schedule, namer: ParamNamer, pending: PendingResults) -> None:
        self._board = board
        self._window = config.grad_window
        self._watched = watched
        self._namer = namer
        self._pending = pending
        self.schedule = schedule
        self._source = ("optimizer", watched.index)
        self._served: set[int] = set()
        self._waiting: dict[int, int] = {}  # parameter index -> optimizer step index it joined at
        #: Every step before this index is looked at (some parameter is inside its window).
        self.window_end = 1

    def after_step(self, index: int, step: int) -> None:
        """Called on sampled steps and on every step before :attr:`window_end`."""
        watched = self._watched
        watched.refresh()
        params = watched.params
        for i, p in enumerate(params):
            if i in self._served:
                continue
            if not p.requires_grad:
                self._waiting.pop(i, None)  # frozen (again): nothing to expect
            elif i not in self._waiting:
                self._waiting[i] = index
        if not self._waiting:
            return
        self.window_end = max(self.window_end, max(self._waiting.values()) + self._window)
        grads = {i: grad for i in self._waiting if (grad := params[i].grad) is not None}
        dense = [i for i, grad in grads.items() if not grad.is_sparse]
        sparse = [i for i, grad in grads.items() if grad.is_sparse]
        norms = list(torch._foreach_norm([grads[i] for i in dense], math.inf)) if dense else []
        norms += [grads[i]._values().abs().amax() if grads[i]._nnz() else
                  torch.zeros((), device=params[i].device) for i in sparse]
        resolve = partial(self._resolve, index, step, dense + sparse)
        if norms:
            self._pending.add(self, stack_on(norms, norms[0].device) != 0, resolve)
        else:
            resolve(torch.zeros(0, dtype=torch.bool))

    def _resolve(self, index: int, step: int, checked: list[int], received: torch.Tensor) -> None:
        for i, got in zip(checked, received.tolist(), strict=True):
            if got:
                self._served.add(i)
                self._waiting.pop(i, None)
        overdue = sorted(i for i, since in self._waiting.items() if index - since + 1 >= self._window)
        opt = self._watched.index
        if overdue:
            names = [self._watched.label(self._namer, i) for i in overdue]
            message = (f"optimizer {opt}: {len(overdue)} trainable parameters got no gradient in "
                       f"{self._window} steps: {name_list(names)}")
            details = {"optimizer": opt, "params": names[:50], "missing": len(overdue),
                       "window": self._window,
                       "likely_causes": ["part of the forward runs under torch.no_grad() or uses .detach()",
                                         "a branch or layer that the forward never uses",
                                         "a gate or mask that multiplies the branch by zero"]}
            self._board.violation(RECEIVE, self._source, step, message, details, names)
        elif self._served:
            waiting = (f"; {len(self._waiting)} still within their first {self._window} steps"
                       if self._waiting else "")
            self._board.report(RECEIVE, self._source, "ok", step,
                               f"optimizer {opt}: {len(self._served)} trainable parameters received gradients"
                               + waiting)
