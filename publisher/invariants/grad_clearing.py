"""Gradients are cleared between optimizer steps (``grads_cleared``).

One small dense *sentinel* parameter per optimizer (the smallest one that had a gradient at its
first step, typically a bias) carries a ``Tensor.register_hook``. That hook runs when backward
produces the sentinel's gradient, *before* it is accumulated, so ``p.grad`` still holds the old
value: ``None`` (``zero_grad(set_to_none=True)``, free to test) or all zeros
(``set_to_none=False``) means "cleared before this backward".

A window runs from one ``step()`` pre-hook to the next. It is healthy when at least one backward
in it saw a cleared gradient; it is a violation when backwards ran and none did. This accepts,
without special cases: gradient accumulation (k backwards, the first sees the cleared gradient),
LBFGS closures (``zero_grad`` + backward inside ``step()``, so inside the window), and GANs
(D's parameters receive G-loss gradients, but ``opt_d.zero_grad()`` still precedes D's backward).

Windows are opened only before sampled steps, and the hook is installed only while one is open,
so most backward passes never call into Python. On CUDA the all-zero test stays a device tensor
until the window closes and is then read without a sync.
"""

from __future__ import annotations

from functools import partial

import torch
from torch.utils.hooks import RemovableHandle

from publisher.invariants.config import InvariantConfig
from publisher.invariants.core import PendingResults, StatusBoard, WatchedOptimizer
from publisher.measure.budget import Schedule
from publisher.measure.check import Check
from publisher.measure.tensors import ParamNamer, stack_on

CLEARED = "grads_cleared"


class ClearingCheck(Check):
    """Watches one sentinel parameter of an optimizer across the windows between its steps."""

    names = (CLEARED,)

    def __init__(self, board: StatusBoard, config: InvariantConfig, watched: WatchedOptimizer,
                 schedule: Schedule, namer: ParamNamer, pending: PendingResults) -> None:
        self._board = board
        self._watched = watched
        self._namer = namer
        self._pending = pending
        self.schedule = schedule
        self._source = ("optimizer", watched.index)
        self._sentinel: torch.Tensor | None = None
        self._sentinel_name = ""
        self._handle: RemovableHandle | None = None  # the sentinel's hook, while a window is open
        self.armed = False
        self._backwards = 0
        self._cleared = False
        self._zero_tests: list[torch.Tensor] = []

    @property
    def has_sentinel(self) -> bool:
        return self._sentinel is not None

    def before_step(self, index: int, step: int) -> None:
        """Called when a window is open or the next step is sampled."""
        if self.armed:
            self._close_window(step)
        sentinel = self._sentinel
        if sentinel is not None and self.schedule.due(index + 1):
            self._open_window(sentinel)
        else:
            self._unhook()

    def after_step(self, index: int) -> None:
        """Called until a sentinel is chosen."""
        sentinel = self._pick_sentinel()
        if sentinel is not None and self.schedule.due(index + 1):
            self._open_window(sentinel)

    def close(self) -> None:
        self.armed = False
        self._unhook()

    def _unhook(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _pick_sentinel(self) -> torch.Tensor | None:
        watched = self._watched
        watched.refresh()
        candidates = [(p.numel(), i) for i, p in enumerate(watched.params)
                      if p.requires_grad and p.grad is not None and not p.grad.is_sparse]
        if not candidates:
            candidates = [(p.numel(), i) for i, p in enumerate(watched.params)
                          if p.requires_grad and p.grad is not None]
        if not candidates:
            return None
        _, i = min(candidates)
        self._sentinel = watched.params[i]
        self._sentinel_name = watched.label(self._namer, i)
        return self._sentinel

    def _open_window(self, sentinel: torch.Tensor) -> None:
        # The hook is installed for the window only: outside, backward does not call into Python.
        if self._handle is None:
            self._handle = sentinel.register_hook(partial(self._on_gradient, sentinel))
        self.armed = True
        self._backwards = 0
        self._cleared = False
        self._zero_tests = []

    def _on_gradient(self, sentinel: torch.Tensor, grad: torch.Tensor) -> None:
        """Runs inside backward, before accumulation: ``sentinel.grad`` still holds what was there."""
        if not self.armed:
            return
        with self.meter:
            self._look_at_old_gradient(sentinel.grad)

    def _look_at_old_gradient(self, old: torch.Tensor | None) -> None:
        self._backwards += 1
        if old is None or self._cleared or (old.is_sparse and old._nnz() == 0):
            self._cleared = True
            return
        values = old._values() if old.is_sparse else old
        if values.device.type == "cpu":
            self._cleared = not bool(values.any())
        else:  # keep it on the device: read when the window closes, without a sync
            with torch.no_grad():
                self._zero_tests.append(~values.any())

    def _close_window(self, step: int) -> None:
        self.armed = False
        if self._backwards == 0:
            return  # no backward reached the sentinel: no verdict
        backwards = self._backwards
        if self._cleared or not self._zero_tests:
            self._judge(step, backwards, self._cleared)
        else:
            tests = stack_on(self._zero_tests, self._zero_tests[0].device).any()
            self._pending.add(self, tests, lambda cleared: self._judge(step, backwards, bool(cleared)))
        self._zero_tests = []

    def _judge(self, step: int, backwards: int, cleared: bool) -> None:
        opt = self._watched.index
        if cleared:
            self._board.report(CLEARED, self._source, "ok", step,
                               f"optimizer {opt}: gradients were cleared before step {step}")
            return
        message = (f"optimizer {opt}: gradients were not cleared between two steps ({backwards} backward "
                   f"pass(es) accumulated onto the previous step's gradients of {self._sentinel_name})")
        details = {"optimizer": opt, "sentinel": self._sentinel_name, "backwards_in_window": backwards,
                   "likely_causes": ["optimizer.zero_grad() (or model.zero_grad()) missing from the loop",
                                     "zero_grad() called on a different optimizer or model than the one "
                                     "stepped"]}
        self._board.violation(CLEARED, self._source, step, message, details, ["not cleared"])
