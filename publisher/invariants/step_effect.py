"""``optimizer.step()`` changes what it should and nothing else.

Two invariants share one before/after comparison of an optimizer step:

* ``optimizer_changes_params``: a parameter with a non-zero, finite gradient and ``lr > 0`` changes.
  Catches steps that return before updating, updates assigned to a local (``p = p - lr * g``),
  optimizers over tensors that are not in the graph, optimizers over frozen parameters only.
* ``frozen_stay_frozen``: a parameter with ``requires_grad=False`` that the optimizer owns does not
  change during ``step()`` (momentum or weight decay applied through stale zero gradients after
  freezing). Only the step is watched, not the whole run: target networks updated by an EMA
  outside the optimizer (MoCo, BYOL, DQN) are frozen *and* meant to move. All frozen parameters
  are compared on the first steps; later only those holding a gradient tensor, since built-in
  optimizers skip a parameter whose ``.grad`` is None.

How: on a sampled step, the pre-hook copies at most ``probe_elements`` elements of each parameter
(every k-th element; for a sparse gradient, the rows it touches) and the largest |gradient| over
the same elements; the post-hook compares with one ``_foreach_sub`` and one ``_foreach_norm``. A
parameter whose sampled gradient is zero makes no promise, so sparse or partly dead gradients
never count against it. An unchanged parameter is a suspect until the check on the next step
agrees (the lone step where a tiny update rounds away does not count). Steps given a closure
(LBFGS) are skipped: they evaluate the model themselves and may legitimately reject a move.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import torch

from publisher.invariants.config import InvariantConfig
from publisher.invariants.core import (
    Check,
    ParamNamer,
    PendingResults,
    Schedule,
    StatusBoard,
    WatchedOptimizer,
    flat_sample,
    is_checkable,
    name_list,
    sample_stride,
    stack_on,
)

UPDATES = "optimizer_changes_params"
FROZEN = "frozen_stay_frozen"

_NOOP_CAUSES = [
    "a step() override or wrapper that returns before updating",
    "the update is assigned to a local (p = p - lr * g) instead of applied in place (p.add_)",
    "the parameters were replaced (p.data = ..., re-created model) after the optimizer was built",
]


@dataclass
class _Probe:
    index: int
    rows: torch.Tensor | None  # rows of a sparse gradient; None: every `stride`-th element
    stride: int
    before: torch.Tensor

    def sample(self, param: torch.Tensor) -> torch.Tensor:
        if self.rows is not None:
            return param.detach().index_select(0, self.rows)
        return flat_sample(param, self.stride)


@dataclass
class _Snapshot:
    index: int  # the optimizer's step index
    step: int
    trained: list[_Probe]
    frozen: list[_Probe]
    lr_positive: list[bool]
    grad_max: list[torch.Tensor]


class StepEffectCheck(Check):
    """Compares sampled parameter values before and after one optimizer's sampled steps."""

    names = (UPDATES, FROZEN)

    def __init__(self, board: StatusBoard, config: InvariantConfig, watched: WatchedOptimizer,
                 namer: ParamNamer, pending: PendingResults) -> None:
        self._board = board
        self._limit = config.probe_elements
        self._watched = watched
        self._namer = namer
        self._pending = pending
        self._schedule = Schedule(config.dense_steps, config.check_every)
        self._dense_steps = config.dense_steps
        self._source = ("optimizer", watched.index)
        self._snapshot: _Snapshot | None = None
        self._suspects: set[int] = set()
        self._gradless_checks = 0

    def before_step(self, index: int, step: int, closure: bool) -> None:
        self._snapshot = None
        if closure or not self._schedule.due(index):
            return
        watched = self._watched
        watched.refresh()
        params = watched.params
        trained = [i for i, p in enumerate(params) if p.requires_grad and p.grad is not None and is_checkable(p)]
        # Built-in optimizers skip parameters whose .grad is None, so after the first steps only
        # frozen parameters holding a (stale) gradient tensor are worth the copy.
        dense = index < self._dense_steps
        frozen = [i for i, p in enumerate(params)
                  if not p.requires_grad and (dense or p.grad is not None) and is_checkable(p)]
        self._judge_gradless(index, step, bool(trained))
        trained_probes, grad_samples = [], []
        for i in trained:
            probe, grad_sample = self._probe(i, params[i], params[i].grad)
            if probe is not None:
                trained_probes.append(probe)
                grad_samples.append(grad_sample)
        frozen_probes = [self._probe(i, params[i], None)[0] for i in frozen]
        if not trained_probes and not frozen_probes:
            return
        lr_positive = [(lr := watched.lr(watched.group_of[p.index])) is not None and lr > 0
                       for p in trained_probes]
        grad_max = torch._foreach_norm(grad_samples, math.inf) if grad_samples else []
        self._snapshot = _Snapshot(index, step, trained_probes, frozen_probes, lr_positive, list(grad_max))

    def after_step(self) -> None:
        snap, self._snapshot = self._snapshot, None
        if snap is None:
            return
        params = self._watched.params
        probes = snap.trained + snap.frozen
        after = [probe.sample(params[probe.index]) for probe in probes]
        # A step that gave a parameter another shape or dtype (a growing layer) did change it.
        comparable = [k for k, (now, probe) in enumerate(zip(after, probes, strict=True))
                      if now.shape == probe.before.shape and now.dtype == probe.before.dtype]
        device = probes[0].before.device
        changed = torch.ones(len(probes), dtype=torch.bool, device=device)
        if comparable:
            diffs = torch._foreach_sub([after[k] for k in comparable], [probes[k].before for k in comparable])
            # NaN counts as changed: non-finite values are another detector's business.
            moved = stack_on(torch._foreach_norm(diffs, math.inf), device) != 0
            if len(comparable) == len(probes):
                changed = moved
            else:
                changed[comparable] = moved
        if snap.grad_max:
            grad_max = stack_on(snap.grad_max, device)
            promised = (grad_max != 0) & torch.isfinite(grad_max)
        else:
            promised = torch.zeros(0, dtype=torch.bool, device=device)
        promised = torch.cat([promised, torch.zeros(len(snap.frozen), dtype=torch.bool, device=device)])
        self._pending.add(self, torch.stack([changed, promised]), partial(self._resolve, snap))

    def _probe(self, i: int, param: torch.Tensor, grad: torch.Tensor | None
               ) -> tuple[_Probe | None, torch.Tensor | None]:
        if grad is not None and grad.is_sparse:
            if grad.sparse_dim() != 1 or param.dim() == 0:
                return None, None
            per_row = max(1, param[0].numel())
            rows = grad._indices()[0, : max(1, self._limit // per_row)]
            before = param.detach().index_select(0, rows)
            return _Probe(i, rows, 1, before), grad._values()[: rows.numel()]
        stride = sample_stride(param.numel(), self._limit)
        probe = _Probe(i, None, stride, flat_sample(param, stride).clone())
        return probe, (flat_sample(grad, stride) if grad is not None else None)

    def _resolve(self, snap: _Snapshot, verdict: torch.Tensor) -> None:
        changed, promised = verdict.tolist()
        n_trained = len(snap.trained)
        expected = [p.index for k, p in enumerate(snap.trained) if promised[k] and snap.lr_positive[k]]
        unchanged = {p.index for k, p in enumerate(snap.trained)
                     if promised[k] and snap.lr_positive[k] and not changed[k]}
        moved = [p.index for k, p in enumerate(snap.frozen) if changed[n_trained + k]]
        self._judge_updates(snap, expected, unchanged)
        if snap.frozen:
            self._judge_frozen(snap, moved)

    def _judge_updates(self, snap: _Snapshot, expected: list[int], unchanged: set[int]) -> None:
        if not expected:
            return
        confirmed = sorted(unchanged & self._suspects)
        self._suspects = unchanged
        opt = self._watched.index
        if confirmed:
            names = [self._watched.label(self._namer, i) for i in confirmed]
            message = (f"optimizer {opt}: step() left {len(confirmed)} of {len(expected)} parameters with "
                       f"non-zero gradients and lr > 0 unchanged, on two checks in a row: {name_list(names)}")
            details = {"optimizer": opt, "params": names[:50], "unchanged": len(confirmed),
                       "checked": len(expected), "likely_causes": _NOOP_CAUSES}
            self._board.violation(UPDATES, self._source, snap.step, message, details, names)
        elif unchanged:
            self._schedule.request(snap.index + 1)
        else:
            self._board.report(UPDATES, self._source, "ok", snap.step,
                               f"optimizer {opt}: step() changed all {len(expected)} parameters with gradients")

    def _judge_gradless(self, index: int, step: int, any_gradient: bool) -> None:
        """An optimizer whose parameters carry no gradient at all at step() time does nothing."""
        if any_gradient:
            self._gradless_checks = 0
            return
        self._gradless_checks += 1
        if self._gradless_checks < 2:
            self._schedule.request(index + 1)
            return
        opt = self._watched.index
        params = self._watched.params
        if all(not p.requires_grad for p in params):
            why = (f"optimizer {opt} owns only parameters with requires_grad=False ({len(params)}): "
                   "its step() can never change anything")
            causes = ["the optimizer was given the frozen parameters instead of the trainable ones"]
        else:
            why = (f"optimizer {opt}: none of its {len(params)} parameters has a gradient when step() runs, "
                   "so step() changes nothing")
            causes = ["the optimizer was built over other tensors than the model being trained "
                      "(model re-created, copied or reloaded after the optimizer)",
                      "zero_grad() runs between backward() and step()"]
        details = {"optimizer": opt, "params": len(params), "likely_causes": causes}
        self._board.violation(UPDATES, self._source, step, why, details, ["no gradients"])

    def _judge_frozen(self, snap: _Snapshot, moved: list[int]) -> None:
        opt = self._watched.index
        if moved:
            names = [self._watched.label(self._namer, i) for i in moved]
            message = (f"optimizer {opt}: step() changed {len(moved)} parameters that have "
                       f"requires_grad=False: {name_list(names)}")
            details = {"optimizer": opt, "params": names[:50], "changed": len(moved),
                       "likely_causes": ["momentum or weight decay applied through stale zero gradients "
                                         "(frozen after training started, zero_grad(set_to_none=False))",
                                         "a custom optimizer that does not skip parameters without gradients"]}
            self._board.violation(FROZEN, self._source, snap.step, message, details, names)
        else:
            self._board.report(FROZEN, self._source, "ok", snap.step,
                               f"optimizer {opt}: step() left its {len(snap.frozen)} frozen parameters unchanged")
