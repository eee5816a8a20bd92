"""Every trainable tensor is in some optimizer (``optimizer_owns_trainables``).

A trainable parameter (``requires_grad=True``) that no optimizer owns gets gradients and never
changes: a head added after the optimizer was built, a layer unfrozen without adding it to the
optimizer. With several optimizers (GAN) the union counts. First checked once every optimizer had
``grad_window`` steps to show up (the zero-code launcher discovers a GAN's second optimizer at its
first step), then every ``10 * check_every`` steps, since unfreezing later is exactly when this
goes wrong.

Two sources of trainables: the model's parameters, and the leaves of the loss's autograd graph
(:mod:`publisher.invariants.leaves`), walked on the two steps before each check. A leaf the
graph reached on both steps that no optimizer owns is outside the model too: a layer kept in a
plain list or dict, a weight made with ``requires_grad=True`` in the script. Parameters of the
model that the graph does not reach are reported as ``info`` (leaving a head out can be
deliberate); leaves outside the model that receive a gradient every step and that nobody steps
are ``unowned_tensors``, a warning (nobody keeps a trainable tensor outside the model on purpose
without stepping it).
Tensors the user names (:meth:`~publisher.monitor.Monitor.ignore_unowned`: an input optimised by
hand, a saliency map) are left out.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch
from torch import nn

from publisher.detectors.base import name_list
from publisher.invariants.config import InvariantConfig
from publisher.invariants.core import StatusBoard, WatchedOptimizer
from publisher.invariants.leaves import Leaves, graph_leaves, persistent, where_kept
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
        self._walks: list[Leaves] = []  # the graph's leaves on the latest two walks
        self._walked_at = -1
        self._quiet_until = 0  # step counts below this want no walk
        self._ignored: weakref.WeakSet[torch.Tensor] = weakref.WeakSet()

    def ignore(self, tensors: Sequence[torch.Tensor]) -> None:
        """Leave these out: they get gradients with no optimizer on purpose."""
        self._ignored.update(tensors)

    def wants_graph(self, steps_done: int) -> bool:
        """Walk the loss's graph now? On the two steps before each check, once a step. Asked at
        every step on the training thread, so the steps before the next window answer from one
        comparison (each call there costs microseconds: ``benchmarks/step_floor.py``)."""
        if steps_done < self._quiet_until:
            return False
        due = self.next_due(steps_done)
        if due - steps_done > 2:
            self._quiet_until = due - 2  # next_due is the same for every step count up to there
            return False
        return steps_done != self._walked_at

    def see_graph(self, loss: torch.Tensor, steps_done: int) -> None:
        """Walk ``loss``'s graph (called when :meth:`wants_graph`)."""
        self._walked_at = steps_done
        self._walks = [*self._walks[-1:], graph_leaves(loss)]

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
        walks, self._walks = self._walks, []
        leaves = persistent(*walks) if len(walks) == 2 else []
        if not roots and not leaves:
            return
        owned: set[int] = set()  # ids of the parameters some optimizer steps
        for w in watched:
            w.refresh()
            owned.update(id(p) for p in w.params)
        owned.update(id(t) for t in self._ignored)
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
        outside = [t for t in leaves if id(t) not in seen and id(t) not in owned]
        if outside:
            self._report_outside(step, outside, names, roots)
            return
        if names:
            message = (f"{len(names)} trainable parameters ({unowned:,} values) are in no optimizer and will "
                       f"never change: {name_list(names)}")
            details = {"params": names[:50], "count": len(names), "values": unowned,
                       "likely_causes": ["module added or replaced after the optimizer was built",
                                         "layers unfrozen (requires_grad=True) without adding them to the "
                                         "optimizer", "optimizer built from a filtered parameter list"]}
            self._board.violation(OWNED, "model", step, message, details, names)
        elif trainable or leaves:
            count = trainable or len(leaves)
            self._board.report(OWNED, "model", "ok", step,
                               f"all {count} trainable parameters are owned by an optimizer")

    def _report_outside(self, step: int, outside: list[torch.Tensor], in_model: list[str],
                        roots: Sequence[nn.Module]) -> None:
        """Trainable tensors outside the model that the loss reaches, and nobody steps: a warning."""
        kept = where_kept(outside, roots)
        described = [_describe(t, kept.get(id(t))) for t in outside]
        values = sum(t.numel() for t in outside)
        message = (f"{len(outside)} tensors outside the model receive a gradient every step and no optimizer "
                   f"steps them ({values:,} values that keep their initial values): {name_list(described)}")
        if in_model:
            message += f"; also {len(in_model)} model parameters in no optimizer: {name_list(in_model)}"
        details = {
            "tensors": [{"name": kept.get(id(t)), "shape": list(t.shape),
                         "dtype": str(t.dtype).removeprefix("torch."), "device": str(t.device),
                         "is_parameter": isinstance(t, nn.Parameter), "grad_kept": t.grad is not None}
                        for t in outside[:50]],
            "count": len(outside), "values": values, "params": in_model[:50],
            "likely_causes": [
                "layers kept in a plain Python list or dict (use nn.ModuleList / nn.ModuleDict)",
                "a weight created with requires_grad=True in the script and not given to the optimizer",
                "a module built after the optimizer and never registered",
            ],
        }
        keys = [f"{name}#{id(t)}" for name, t in zip(described, outside, strict=True)]
        self._board.violation(OWNED, "model", step, message, details, keys, kind="unowned_tensors")


def _describe(tensor: torch.Tensor, name: str | None) -> str:
    shape = f"[{'x'.join(map(str, tensor.shape))}]"
    if name is not None:
        return f"{name} {shape}"
    return f"{'Parameter' if isinstance(tensor, nn.Parameter) else 'tensor'}{shape}"
