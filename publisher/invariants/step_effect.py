"""``optimizer.step()`` changes what it should and nothing else.

Two invariants share one before/after look at an optimizer step:

* ``optimizer_changes_params``: a parameter holding a gradient, with ``lr > 0``, changes;
* ``frozen_stay_frozen``: a parameter with ``requires_grad=False`` that the optimizer owns does not
  change during ``step()`` (only the step is watched: an EMA target moved outside the optimizer
  is frozen *and* meant to move).

Every in-place write bumps a tensor's version counter (``p._version``), so the pre- and post-hook
of a sampled step read the versions: no tensor op, no device work. Values are compared only where
versions cannot tell: a parameter whose version did not move (a *suspect*, compared on the next
step, at most ``probe_elements`` elements with their gradients), an optimizer that writes without
bumping versions (fused kernels: compared from then on), frozen parameters holding a gradient.
Steps given a closure (LBFGS) are skipped. The faults each invariant catches, how values are
compared and what it costs: docs/detectors.md, "``optimizer_noop``, ``frozen_param_changed``".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial

import torch

from publisher.detectors.base import name_list
from publisher.invariants.config import InvariantConfig
from publisher.invariants.core import PendingResults, StatusBoard, WatchedOptimizer
from publisher.measure.budget import Schedule
from publisher.measure.check import Check
from publisher.measure.tensors import ParamNamer, flat_sample, is_checkable, sample_stride

UPDATES = "optimizer_changes_params"
FROZEN = "frozen_stay_frozen"

_NOOP_CAUSES = [
    "a step() override or wrapper that returns before updating",
    "the update is assigned to a local (p = p - lr * g) instead of applied in place (p.add_)",
    "the parameters were replaced (p.data = ..., re-created model) after the optimizer was built",
]
_FROZEN_CAUSES = [
    "momentum or weight decay applied through stale zero gradients (frozen after training started, "
    "zero_grad(set_to_none=False))",
    "a custom optimizer that does not skip parameters without gradients",
]


class _Sampler:
    """Flat samples of parameters: at most ``limit`` elements each, every k-th one.

    For a contiguous parameter the sample is a view, cached while the parameter keeps its storage
    (the cached view keeps the old storage alive, so an equal ``data_ptr`` means the same
    storage); a non-contiguous one is copied each time.
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
class _Values:
    """Sampled values of some parameters before a step (and their gradients' largest entries)."""

    indices: list[int]  # trained ones first, then frozen ones
    trained: int  # how many of ``indices`` are trained parameters
    rows: dict[int, torch.Tensor]  # parameter index -> rows compared (sparse gradients)
    before: torch.Tensor  # all samples, concatenated
    lengths: list[int]
    grad_max: torch.Tensor | None  # largest |gradient| in each trained parameter's sample


@dataclass
class _Snapshot:
    index: int  # the optimizer's step index
    step: int
    versions: list[int]
    trained: list[int]  # parameters holding a gradient (expected to change when lr > 0)
    frozen: list[int]  # parameters with requires_grad=False (must not change)
    moving_groups: set[int]  # param groups whose lr is > 0
    values: _Values | None = None
    written: set[int] = field(default_factory=set)


class StepEffectCheck(Check):
    """Watches what one optimizer's sampled steps do to its parameters."""

    names = (UPDATES, FROZEN)

    def __init__(self, board: StatusBoard, config: InvariantConfig, watched: WatchedOptimizer,
                 schedule: Schedule, namer: ParamNamer, pending: PendingResults) -> None:
        self._board = board
        self._sampler = _Sampler(config.probe_elements)
        self._watched = watched
        self._namer = namer
        self._pending = pending
        self.schedule = schedule
        self._source = ("optimizer", watched.index)
        self._snapshot: _Snapshot | None = None
        self._segments: tuple[tuple[int, ...], torch.Tensor] | None = None
        self._suspects: set[int] = set()  # trained parameters whose last check saw no change
        self._frozen_suspects: set[int] = set()  # frozen ones written without a value comparison
        self._values_always = False  # this optimizer changes values without bumping versions
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
        trained = [i for i, p in enumerate(params) if p.requires_grad and p.grad is not None]
        frozen = [i for i, p in enumerate(params) if not p.requires_grad]
        self._judge_gradless(index, step, bool(trained))
        if not trained and not frozen:
            return
        moving = {g for g in range(len(watched.optimizer.param_groups)) if (lr := watched.lr(g)) and lr > 0}
        snap = _Snapshot(index, step, [p._version for p in params], trained, frozen, moving)
        compare = list(trained) if self._values_always else [i for i in trained if i in self._suspects]
        compare += [i for i in frozen if params[i].grad is not None or i in self._frozen_suspects]
        if compare:
            snap.values = self._take_values(params, [i for i in compare if is_checkable(params[i])])
        self._snapshot = snap

    def after_step(self) -> None:
        """Called when :meth:`before_step` took a snapshot (the checker asks :attr:`has_snapshot`)."""
        snap, self._snapshot = self._snapshot, None
        assert snap is not None, "after_step without a snapshot"
        params = self._watched.params
        snap.written = {i for i, p in enumerate(params) if p._version != snap.versions[i]}
        values = snap.values
        if values is None:
            self._resolve(snap, None)
            return
        samples = self._samples(params, values.indices, values.rows)
        device = values.before.device
        if [s.numel() for s in samples] == values.lengths:
            after = torch.cat(samples) if len(samples) > 1 else samples[0]
            # NaN counts as moved: non-finite values are another detector's business.
            moved = torch.zeros(len(samples), device=device).scatter_reduce_(
                0, self._segment_ids(values.lengths, device), (after != values.before).float(), "amax")
        else:  # the step replaced a parameter by one of another size (a growing layer): it moved
            pairs = zip(samples, values.lengths, values.before.split(values.lengths), strict=True)
            moved = torch.tensor([s.numel() != n or bool((s != b).any()) for s, n, b in pairs],
                                 dtype=torch.float32, device=device)
        verdict = moved if values.grad_max is None else torch.cat([moved, values.grad_max.to(moved.dtype)])
        self._pending.add(self, verdict, partial(self._resolve, snap))

    # ----------------------------------------------------------------- values

    def _take_values(self, params: list[torch.Tensor], indices: list[int]) -> _Values | None:
        # Trained parameters are compared with their gradients (before_step picked ones that have one).
        with_grad = {i: grad for i in indices
                     if params[i].requires_grad and (grad := params[i].grad) is not None}
        trained = list(with_grad)
        frozen = [i for i in indices if not params[i].requires_grad]
        rows: dict[int, torch.Tensor] = {}
        grad_samples = []
        for i, grad in with_grad.items():
            if not grad.is_sparse:
                grad_samples.append(flat_sample(grad, sample_stride(grad.numel(), self._sampler.limit)))
            elif grad.sparse_dim() == 1:
                per_row = max(1, params[i][0].numel())
                rows[i] = grad._indices()[0, : max(1, self._sampler.limit // per_row)]
                grad_samples.append(grad._values()[: rows[i].numel()].reshape(-1))
            else:
                trained.remove(i)
        indices = trained + frozen
        if not indices:
            return None
        samples = self._samples(params, indices, rows)
        lengths = [s.numel() for s in samples]
        before = torch.cat(samples) if len(samples) > 1 else samples[0].clone()
        grad_max = None
        if grad_samples:
            device = before.device
            grads = torch.cat([g if g.device == device else g.to(device) for g in grad_samples])
            segments = self._segment_ids(lengths, device)[: grads.numel()]
            grad_max = torch.zeros(len(grad_samples), dtype=grads.dtype, device=device).scatter_reduce_(
                0, segments, grads.abs(), "amax")
        return _Values(indices, len(trained), rows, before, lengths, grad_max)

    def _samples(self, params: list[torch.Tensor], indices: list[int], rows: dict[int, torch.Tensor]
                 ) -> list[torch.Tensor]:
        samples = [params[i].detach().index_select(0, rows[i]).reshape(-1) if i in rows
                   else self._sampler.dense(params[i]) for i in indices]
        device = samples[0].device
        if any(s.device != device for s in samples):  # a model spread over several devices
            samples = [s.to(device) for s in samples]
        return samples

    def _segment_ids(self, lengths: list[int], device: torch.device) -> torch.Tensor:
        """``[0, 0, 0, 1, 1, 2, ...]``: which parameter each sampled element belongs to.

        Built on the host and cached: its copy to an accelerator (a blocking host-to-device copy)
        happens again only when the set of compared parameters changes.
        """
        key = tuple(lengths)
        if self._segments is None or self._segments[0] != key or self._segments[1].device != device:
            ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).to(device)
            self._segments = (key, ids)
        return self._segments[1]

    # ----------------------------------------------------------------- verdicts

    def _resolve(self, snap: _Snapshot, verdict: torch.Tensor | None) -> None:
        """``verdict``: what the comparison of ``snap.values`` found (None when none were taken)."""
        moved: dict[int, bool] = {}
        promised: dict[int, bool] = {}
        if snap.values is not None and verdict is not None:
            values = verdict.tolist()
            indices = snap.values.indices
            moved = {i: bool(m) for i, m in zip(indices, values, strict=False)}
            # A gradient sample that is zero (or not finite) makes no promise.
            promised = {i: 0 < g < math.inf for i, g in zip(indices, values[len(indices):], strict=False)}
            if any(moved[i] and i not in snap.written for i in indices[: snap.values.trained]):
                self._values_always = True  # fused kernels, collectives: versions do not tell
        group_of = self._watched.group_of
        expected = [i for i in snap.trained if group_of[i] in snap.moving_groups and promised.get(i, True)]
        unchanged = {i for i in expected if not moved.get(i, i in snap.written)}
        self._judge_updates(snap, expected, unchanged, compared=set(moved))
        if snap.frozen:
            frozen_moved = [i for i in snap.frozen if moved.get(i, False)]
            unsure = {i for i in snap.frozen if i in snap.written and i not in moved}
            self._judge_frozen(snap, frozen_moved, unsure)

    def _judge_updates(self, snap: _Snapshot, expected: list[int], unchanged: set[int], compared: set[int]
                       ) -> None:
        if not expected:
            return
        # Only values compared on two checks in a row confirm; versions only raise suspicion.
        confirmed = sorted(i for i in unchanged & self._suspects if i in compared)
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
                               f"optimizer {opt}: step() changed all {len(expected)} parameters with "
                               "gradients")

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
            why = (f"optimizer {opt}: none of its {len(params)} parameters has a gradient when step() "
                   "runs, so step() changes nothing")
            causes = ["the optimizer was built over other tensors than the model being trained "
                      "(model re-created, copied or reloaded after the optimizer)",
                      "zero_grad() runs between backward() and step()"]
        details = {"optimizer": opt, "params": len(params), "likely_causes": causes}
        self._board.violation(UPDATES, self._source, step, why, details, ["no gradients"])

    def _judge_frozen(self, snap: _Snapshot, moved: list[int], unsure: set[int]) -> None:
        opt = self._watched.index
        self._frozen_suspects = unsure  # written without a value comparison: compare next step
        if unsure:
            self.schedule.request(snap.index + 1)
        if moved:
            names = [self._watched.label(self._namer, i) for i in moved]
            message = (f"optimizer {opt}: step() changed {len(moved)} parameters that have "
                       f"requires_grad=False: {name_list(names)}")
            details = {"optimizer": opt, "params": names[:50], "changed": len(moved),
                       "likely_causes": _FROZEN_CAUSES}
            self._board.violation(FROZEN, self._source, snap.step, message, details, names)
        elif not unsure:
            self._board.report(FROZEN, self._source, "ok", snap.step,
                               f"optimizer {opt}: step() left its {len(snap.frozen)} frozen parameters "
                               "unchanged")
