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
)

UPDATES = "optimizer_changes_params"
FROZEN = "frozen_stay_frozen"

_NOOP_CAUSES = [
    "a step() override or wrapper that returns before updating",
    "the update is assigned to a local (p = p - lr * g) instead of applied in place (p.add_)",
    "the parameters were replaced (p.data = ..., re-created model) after the optimizer was built",
]


class _Sampler:
    """Flat samples of parameters: at most ``limit`` elements each, every k-th one.

    For a contiguous parameter the sample is a view, cached between checks while the parameter
    keeps its storage (the cached view keeps the old storage alive, so an equal ``data_ptr``
    means the same storage); a non-contiguous one is copied each time.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._views: dict[int, tuple[int, torch.Tensor]] = {}

    def dense(self, param: torch.Tensor) -> torch.Tensor:
        if not param.is_contiguous():
            return flat_sample(param, sample_stride(param.numel(), self.limit))
        key, ptr = id(param), param.data_ptr()
        cached = self._views.get(key)
        if cached is None or cached[0] != ptr:
            cached = (ptr, flat_sample(param, sample_stride(param.numel(), self.limit)))
            self._views[key] = cached
        return cached[1]

    def forget(self) -> None:
        self._views.clear()


@dataclass
class _Snapshot:
    index: int  # the optimizer's step index
    step: int
    trained: list[int]  # parameter indices expected to change (they hold a gradient)
    frozen: list[int]  # parameter indices that must not change
    rows: dict[int, torch.Tensor]  # parameter index -> rows compared (sparse gradients)
    lr_positive: list[bool]
    before: torch.Tensor  # all samples, concatenated
    lengths: list[int]
    grad_norms: torch.Tensor | None  # largest |gradient| in each trained parameter's sample


class StepEffectCheck(Check):
    """Compares sampled parameter values before and after one optimizer's sampled steps.

    Cost of a sampled step, whatever the number of parameters: one ``cat`` of the samples
    before and one after, an element-wise ``!=``, one ``scatter_reduce`` to get "any element
    moved" per parameter, one ``cat`` + ``scatter_reduce`` for the largest gradient per
    parameter, and one small tensor read back (see
    :class:`~publisher.invariants.core.PendingResults`). Per-parameter Python is limited to
    taking views (cached for the parameters themselves). (``_foreach_norm`` was measured slower
    on the CPU for many small tensors: it loops per tensor.)
    """

    names = (UPDATES, FROZEN)

    def __init__(self, board: StatusBoard, config: InvariantConfig, watched: WatchedOptimizer,
                 namer: ParamNamer, pending: PendingResults) -> None:
        self._board = board
        self._sampler = _Sampler(config.probe_elements)
        self._watched = watched
        self._namer = namer
        self._pending = pending
        self.schedule = Schedule(config.dense_steps, config.check_every)
        self._dense_steps = config.dense_steps
        self._source = ("optimizer", watched.index)
        self._snapshot: _Snapshot | None = None
        self._segments: tuple[tuple[int, ...], torch.Tensor] | None = None
        self._suspects: set[int] = set()
        self._gradless_checks = 0

    @property
    def has_snapshot(self) -> bool:
        return self._snapshot is not None

    def before_step(self, index: int, step: int, closure: bool) -> None:
        """Called on sampled steps."""
        self._snapshot = None
        if closure:
            return
        watched = self._watched
        if watched.refresh():
            self._sampler.forget()
        params = watched.params
        trained = [i for i, p in enumerate(params) if p.requires_grad and p.grad is not None and is_checkable(p)]
        # Built-in optimizers skip parameters whose .grad is None, so after the first steps only
        # frozen parameters holding a (stale) gradient tensor are worth the copy.
        dense = index < self._dense_steps
        frozen = [i for i, p in enumerate(params)
                  if not p.requires_grad and (dense or p.grad is not None) and is_checkable(p)]
        self._judge_gradless(index, step, bool(trained))
        rows: dict[int, torch.Tensor] = {}
        grad_samples = []
        for i in trained:
            grad = params[i].grad
            if grad.is_sparse:
                if grad.sparse_dim() != 1:
                    continue
                per_row = max(1, params[i][0].numel())
                rows[i] = grad._indices()[0, : max(1, self._sampler.limit // per_row)]
                grad_samples.append(grad._values()[: rows[i].numel()].reshape(-1))
            else:
                grad_samples.append(flat_sample(grad, sample_stride(grad.numel(), self._sampler.limit)))
        trained = [i for i in trained if i in rows or not params[i].grad.is_sparse]
        if not trained and not frozen:
            return
        samples = self._samples(params, trained + frozen, rows)
        lengths = [s.numel() for s in samples]
        before = torch.cat(samples) if len(samples) > 1 else samples[0].clone()
        lr_positive = [(lr := watched.lr(watched.group_of[i])) is not None and lr > 0 for i in trained]
        grad_norms = None
        if grad_samples:  # the largest |gradient| of each parameter's sample
            device = before.device
            grads = torch.cat([g if g.device == device else g.to(device) for g in grad_samples])
            segments = self._segment_ids(lengths, device)[: grads.numel()]
            grad_norms = torch.zeros(len(grad_samples), dtype=grads.dtype, device=device).scatter_reduce_(
                0, segments, grads.abs(), "amax")
        self._snapshot = _Snapshot(index, step, trained, frozen, rows, lr_positive, before, lengths, grad_norms)

    def after_step(self) -> None:
        """Called when :meth:`before_step` took a snapshot."""
        snap, self._snapshot = self._snapshot, None
        samples = self._samples(self._watched.params, snap.trained + snap.frozen, snap.rows)
        device = snap.before.device
        if [s.numel() for s in samples] == snap.lengths:
            after = torch.cat(samples) if len(samples) > 1 else samples[0]
            # NaN counts as moved: non-finite values are another detector's business.
            moved = torch.zeros(len(samples), device=device).scatter_reduce_(
                0, self._segment_ids(snap.lengths, device), (after != snap.before).float(), "amax")
        else:  # the step replaced a parameter by one of another size (a growing layer): it moved
            moved = torch.tensor([s.numel() != n or bool((s != b).any()) for s, n, b in
                                  zip(samples, snap.lengths, snap.before.split(snap.lengths), strict=True)],
                                 dtype=torch.float32, device=device)
        verdict = moved if snap.grad_norms is None else torch.cat([moved, snap.grad_norms.to(moved.dtype)])
        self._pending.add(self, verdict, partial(self._resolve, snap))

    def _samples(self, params: list[torch.Tensor], indices: list[int], rows: dict[int, torch.Tensor]
                 ) -> list[torch.Tensor]:
        samples = [params[i].detach().index_select(0, rows[i]).reshape(-1) if i in rows
                   else self._sampler.dense(params[i]) for i in indices]
        device = samples[0].device
        if any(s.device != device for s in samples):  # a model spread over several devices
            samples = [s.to(device) for s in samples]
        return samples

    def _segment_ids(self, lengths: list[int], device: torch.device) -> torch.Tensor:
        """``[0, 0, 0, 1, 1, 2, ...]``: which parameter each sampled element belongs to (cached)."""
        key = tuple(lengths)
        if self._segments is None or self._segments[0] != key or self._segments[1].device != device:
            ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).to(device)
            self._segments = (key, ids)
        return self._segments[1]

    def _resolve(self, snap: _Snapshot, verdict: torch.Tensor) -> None:
        values = verdict.tolist()
        n_trained, n_probes = len(snap.trained), len(snap.trained) + len(snap.frozen)
        changed, grad_norms = values[:n_probes], values[n_probes:]
        # A gradient sample that is non-zero and finite promises a change (lr > 0 given).
        promised = [0 < g < math.inf and snap.lr_positive[k] for k, g in enumerate(grad_norms)]
        expected = [i for k, i in enumerate(snap.trained) if promised[k]]
        unchanged = {i for k, i in enumerate(snap.trained) if promised[k] and not changed[k]}
        moved = [i for k, i in enumerate(snap.frozen) if changed[n_trained + k]]
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
            self.schedule.request(snap.index + 1)
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
            self.schedule.request(index + 1)
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
