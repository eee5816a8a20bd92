"""Every trainable parameter of the model is in some optimizer (``optimizer_owns_trainables``).

A trainable parameter (``requires_grad=True``) that no optimizer owns gets gradients and never
changes: a head added after the optimizer was built, a layer unfrozen without adding it to the
optimizer. With several optimizers (GAN) the union counts. Reported once as ``info``: leaving a
parameter out can be deliberate. First checked once every optimizer had ``grad_window`` steps to
show up (the zero-code launcher discovers a GAN's second optimizer at its first step), then every
``10 * check_every`` steps, since unfreezing later is exactly when this goes wrong.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from publisher.detectors.base import name_list
from publisher.invariants.config import InvariantConfig
from publisher.invariants.core import StatusBoard, WatchedOptimizer
from publisher.measure.check import Check
from publisher.measure.tensors import ParamNamer

OWNED = "optimizer_owns_trainables"


class OwnershipCheck(Check):
    names = (OWNED,)

    def __init__(self, board: StatusBoard, config: InvariantConfig, namer: ParamNamer) -> None:
        self._board = board
        self._first = config.grad_window - 1
        # Unowned parameters do no harm beyond not training: a slower cadence is enough.
        self._every = config.check_every * 10
        self._namer = namer
        self._last_checked = -1

    def due(self, index: int) -> bool:
        return index != self._last_checked and (
            index == self._first or (index > self._first and index % self._every == 0))

    def next_due(self, upcoming: int) -> int:
        """The smallest later step count ``c`` (> ``upcoming``) with ``due(c - 1)``."""
        if upcoming <= self._first:
            return self._first + 1
        return -(-upcoming // self._every) * self._every + 1

    def after_step(self, index: int, step: int, roots: Sequence[nn.Module],
                   watched: Sequence[WatchedOptimizer]) -> None:
        """Called when :meth:`due`."""
        self._last_checked = index
        if not roots:
            return
        owned: set[int] = set()  # ids of the parameters some optimizer steps
        for w in watched:
            w.refresh()
            owned.update(id(p) for p in w.params)
        seen: set[int] = set()
        trainable = unowned = 0
        names: list[str] = []
        for root in roots:
            for p in root.parameters():
                if id(p) in seen or not p.requires_grad:
                    continue
                seen.add(id(p))
                trainable += 1
                if id(p) not in owned:
                    unowned += p.numel()
                    names.append(self._namer.name(p, f"[{'x'.join(map(str, p.shape))}]"))
        if names:
            message = (f"{len(names)} trainable parameters ({unowned:,} values) are in no optimizer and will "
                       f"never change: {name_list(names)}")
            details = {"params": names[:50], "count": len(names), "values": unowned,
                       "likely_causes": ["module added or replaced after the optimizer was built",
                                         "layers unfrozen (requires_grad=True) without adding them to the "
                                         "optimizer", "optimizer built from a filtered parameter list"]}
            self._board.violation(OWNED, "model", step, message, details, names)
        elif trainable:
            self._board.report(OWNED, "model", "ok", step,
                               f"all {trainable} trainable parameters are owned by an optimizer")
