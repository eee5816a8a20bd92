"""``StepHooks``: tuimon's one step pre-hook and one post-hook on an optimizer, shared by its parts.

Three parts of a Monitor look at optimizer steps: the non-finite check (before the update, on the
steps whose gradient norm is due), the invariants (their clock, and checks on sampled steps) and
the per-layer update probe (around sampled steps). Each used to register its own pair of hooks
(``Optimizer.register_step_pre_hook`` / ``register_step_post_hook``, PyTorch 2.0), called by torch on
every step to find, most of the time, that nothing was due. Measured in place, between training
steps whose kernels have evicted their code from the caches, those six calls cost a ~1 ms CPU
step of an MLP 18-20 µs of the training thread, two calls that only count ~1 µs (docs/benchmarks.md, "the
cost of watching"). So there is one pair per optimizer: it counts the outermost steps, and calls a
part only on the steps the part asked for (:meth:`StepPart.after_step` returns the next one;
:meth:`StepHooks.call_at` moves it from outside, :meth:`StepHooks.wake` brings it forward).

A part called before a step is called after it, with the same index (unless the step raised):
what it set up for the update (a stash, a snapshot) is undone or measured there.

torch wraps ``step`` with the hooks per class, so a subclass whose ``step`` calls
``super().step()`` fires the hooks twice, nested, once the base class was also instantiated: the
outer call counts, told from a new step after one that raised (whose post-hook never ran) by the
outer call's wrapper frame still being on the stack.
"""

from __future__ import annotations

import sys
import weakref
from types import FrameType
from typing import Protocol

import torch

#: A step index no part waits for.
NEVER = sys.maxsize


class StepPart(Protocol):
    """What :class:`StepHooks` calls around the steps a part asked for (0-based ``index``: the
    outermost steps of the optimizer counted since its hooks were made)."""

    def before_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict, index: int) -> None:
        """Before the update of step ``index`` (raising stops the step: ``on_nonfinite="stop"``)."""

    def after_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict, index: int) -> int:
        """After the update of step ``index``; returns the index of the next step to be called on
        (``index + 1``: the next one; :data:`NEVER`: none until :meth:`StepHooks.wake`)."""
        ...


#: No step's parts called (yet).
_NONE_CALLED: tuple[int, tuple[StepPart, ...]] = (-1, ())


class StepHooks:
    """One optimizer's step count and the parts called around its steps (see the module's
    docstring). Made by :func:`hooks_on`; its torch hooks go when its last part is removed."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        #: Outermost steps finished.
        self.count = 0
        self._due: dict[StepPart, int] = {}  # each part's next step index
        self._quiet_until = NEVER  # the smallest of them: steps below call no part
        self._outer: FrameType | None = None  # the wrapper frame of the step running
        self._called = _NONE_CALLED  # the running step's index and the parts called before it
        self._handles = [optimizer.register_step_pre_hook(self._before),
                         optimizer.register_step_post_hook(self._after)]
        self._key = id(optimizer)
        self.optimizer = weakref.ref(optimizer, self._forget)

    def add(self, part: StepPart) -> StepHooks:
        """Call ``part`` from the next step on (until its :meth:`StepPart.after_step` says
        otherwise); returns these hooks, which the part keeps to remove itself."""
        self._due[part] = self.count
        self._quiet_until = min(self._quiet_until, self.count)
        return self

    def remove(self, part: StepPart) -> None:
        """Stop calling ``part``; the last one gone takes the torch hooks with it."""
        if self._due.pop(part, None) is None:
            return
        if self._due:
            self._quiet_until = min(self._due.values())
            return
        for handle in self._handles:
            handle.remove()
        self._forget()

    def _forget(self, _: object = None) -> None:
        """No longer the optimizer's hooks (its parts are gone, or the optimizer is)."""
        if _BOARD.get(self._key) is self:
            del _BOARD[self._key]

    def call_at(self, part: StepPart, index: int) -> None:
        """Call ``part`` next on step ``index`` (sooner or later than it asked)."""
        if part in self._due:
            self._due[part] = index
            self._quiet_until = min(self._due.values())

    def wake(self, part: StepPart) -> None:
        """Call ``part`` from the next step on (what it waits for came from outside its hooks)."""
        if part in self._due:
            self._due[part] = min(self._due[part], self.count)
            self._quiet_until = min(self._quiet_until, self.count)

    def _before(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        call = sys._getframe(1)
        if self._outer is not None and _nested(self._outer, call):
            return
        self._outer = call
        index = self.count
        if index < self._quiet_until:
            self._called = _NONE_CALLED  # a step that raised left its parts here
            return
        # A copy first (one C call, whole under the GIL): a part added or removed on another thread
        # meanwhile must not break the user's step.
        parts = tuple(part for part, due in list(self._due.items()) if due <= index)
        self._called = (index, parts)
        for part in parts:
            part.before_step(optimizer, args, kwargs, index)

    def _after(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if sys._getframe(1) is not self._outer:
            return  # the inner step() of a subclass calling super().step()
        self._outer = None
        index = self.count
        self.count = index + 1
        called_at, parts = self._called
        if called_at != index:
            return  # no part called before this step (one woken meanwhile is called from the next)
        self._called = _NONE_CALLED
        due = self._due
        for part in parts:
            if part in due:  # not removed meanwhile
                due[part] = part.after_step(optimizer, args, kwargs, index)
        self._quiet_until = min(due.values(), default=NEVER)


#: Each optimizer's hooks while it has parts, by the optimizer's ``id`` (an optimizer class may
#: define ``__eq__`` and so not hash).
_BOARD: dict[int, StepHooks] = {}


def hooks_on(optimizer: torch.optim.Optimizer) -> StepHooks:
    """The optimizer's :class:`StepHooks`, made (and its torch hooks registered) on first use."""
    hooks = _BOARD.get(id(optimizer))
    if hooks is None or hooks.optimizer() is not optimizer:
        hooks = _BOARD[id(optimizer)] = StepHooks(optimizer)
    return hooks


def _nested(outer_call: FrameType, call: FrameType) -> bool:
    """Is this ``step()`` running inside the one already being watched (see the module's docstring)?"""
    frame = call.f_back
    while frame is not None:
        if frame is outer_call:
            return True
        frame = frame.f_back
    return False

