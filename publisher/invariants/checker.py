"""``InvariantChecker``: installs the hooks and feeds the checks (the Monitor constructs it).

Hooks it installs, all removed by :meth:`InvariantChecker.close`:

* A part of each optimizer's shared step hooks (:mod:`publisher.measure.step_hooks`): the clock
  (each optimizer counts its own steps) and the before/after comparisons, called on the steps the
  checks plan for. They run whether or not the user calls ``Monitor.step()``.
* ``Tensor.register_hook`` on one small sentinel parameter per optimizer (gradient clearing).
* A forward pre-hook on each root module, only during sampled steps (train/eval mode); with no
  model, a global module forward pre-hook during a few sampled steps to discover the roots.

The tie check (``ties_hold``) installs nothing: it looks at the model from the optimizer hooks.

Steps: the checker counts optimizer steps itself, 0-based. An event's ``step`` is the index of the
optimizer step it was observed at; with several optimizers, the largest index so far (a GAN's D
and G steps of one iteration share a number).

Every check runs inside a guard: one that raises is switched off and its invariants turn
``unchecked`` with the error, so a bug here never stops a training run.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from publisher.invariants.config import INVARIANT_NAMES, InvariantConfig
from publisher.invariants.core import EmitStatus, EmitViolation, PendingResults, StatusBoard, WatchedOptimizer
from publisher.invariants.grad_arrival import ArrivalCheck
from publisher.invariants.grad_clearing import ClearingCheck
from publisher.invariants.learning_rate import ZeroLrCheck
from publisher.invariants.ownership import OwnershipCheck
from publisher.invariants.replicas import ReplicaCheck
from publisher.invariants.step_effect import StepEffectCheck
from publisher.invariants.ties import TieCheck
from publisher.invariants.train_mode import TrainModeCheck
from publisher.measure.budget import CostBudget, CostMeter, Schedule, StepClock
from publisher.measure.check import Check
from publisher.measure.step_hooks import StepHooks, hooks_on
from publisher.measure.tensors import ParamNamer, unwrap
from publisher.stats.discovery import RootDiscovery

_log = logging.getLogger(__name__)


@dataclass
class _Watch:
    """One optimizer, its per-optimizer checks, and its part of the optimizer's step hooks (which
    count its steps: ``base`` of them had passed when the checker began to watch it)."""

    watched: WatchedOptimizer
    hooks: StepHooks
    #: Sampled steps of this optimizer, shared by its checks (a confirmation asked for by one
    #: runs them all, which costs little and keeps the hooks' fast path to one test).
    schedule: Schedule
    effect: StepEffectCheck | None
    zero_lr: ZeroLrCheck | None
    arrival: ArrivalCheck | None
    clearing: ClearingCheck | None
    base: int = 0
    #: Steps with a smaller index need no per-optimizer work at all (see ``_plan_quiet``).
    quiet_until: int = 0
    #: What the step hooks call (:class:`_WatchPart`).
    part: _WatchPart | None = None

    @property
    def count(self) -> int:
        """The optimizer's steps since the checker began to watch it."""
        return self.hooks.count - self.base

    def checks(self) -> list[Check]:
        return [c for c in (self.effect, self.zero_lr, self.arrival, self.clearing) if c is not None]


class _WatchPart:
    """One optimizer's part in its step hooks: the checker's hooks for it, in the checker's count."""

    __slots__ = ("_after", "_before", "_watch")

    def __init__(self, watch: _Watch, before: Callable[[_Watch, tuple, dict, int], None],
                 after: Callable[[_Watch, int], int]) -> None:
        self._watch, self._before, self._after = watch, before, after

    def before_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict, index: int) -> None:
        watch = self._watch
        self._before(watch, args, kwargs, index - watch.base)

    def after_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict, index: int) -> int:
        watch = self._watch
        return self._after(watch, index - watch.base) + watch.base


class InvariantChecker:
    """Checks the training invariants of one training process online, from hooks.

    ``emit_violation(kind, severity, message, step, details)`` is called once per episode of a
    violation; ``emit_status(name, status, step, message, details)`` once at start per invariant
    (``unchecked``) and then whenever an invariant's status changes.
    """

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer], model: nn.Module | None, *,
                 emit_violation: EmitViolation, emit_status: EmitStatus,
                 config: InvariantConfig | None = None, rank: int = 0, process_group=None,
                 step_clock: StepClock | None = None) -> None:
        self.config = config or InvariantConfig()
        self.rank = rank
        self._board = StatusBoard(emit_status, emit_violation)
        self._meter = CostMeter()
        self._budget = CostBudget(self.config.budget, every=self.config.check_every,
                                  longest=self.config.max_check_every, within_s=self.config.check_within_s,
                                  what="InvariantConfig.budget")
        # How long a training step takes, which ``budget`` is a share of (the Monitor keeps it);
        # without one, checks keep to ``check_every`` whatever they cost.
        self._clock = step_clock
        self._spent_at_retime = 0
        self._pending = PendingResults(self._fail)
        self._namer = ParamNamer()
        self._watches: dict[int, _Watch] = {}
        self._only: _Watch | None = None  # the one watched optimizer, while there is one
        self._roots: list[tuple[str, nn.Module]] = []
        self._global_quiet_until = 0  # the same, for the checks about the model and the run
        self._closed = False
        on = self._enabled
        self._train_mode = TrainModeCheck(self._board, self.config) if on("model_in_train_mode") else None
        self._ownership = (OwnershipCheck(self._board, self.config, self._namer)
                           if on("optimizer_owns_trainables") else None)
        self._replicas = (ReplicaCheck(self._board, self.config, process_group, self._replica_params,
                                       self._namer) if on("replicas_consistent") else None)
        self._ties = TieCheck(self._board, self.config, self._pending) if on("ties_hold") else None
        self._discovery = None
        if model is None and (self._train_mode or self._ownership or self._ties):
            self._discovery = RootDiscovery(Schedule(self.config.dense_steps, self.config.check_every),
                                            self._owned_ids, partial(self._adopt, discovered=True))
        if model is not None:
            self._adopt(model)
        self._announce(model)
        for check in (self._train_mode, self._ownership, self._replicas, self._ties, self._discovery):
            if check is not None:
                check.meter = self._meter
        for optimizer in optimizers:
            self.add_optimizer(optimizer)
        if self._discovery is not None:
            self._run(self._discovery, self._discovery.after_step, 0)  # see the very first forward

    # ----------------------------------------------------------------- public API

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Watch one more optimizer (a GAN's second one, or one the launcher found at run time)."""
        if self._closed or id(optimizer) in self._watches:
            return
        watched = WatchedOptimizer(len(self._watches), optimizer)
        watched.refresh()
        schedule = Schedule(self.config.dense_steps, self.config.check_every)
        on, args = self._enabled, (self._board, self.config, watched, schedule)
        hooks = hooks_on(optimizer)
        watch = _Watch(
            watched, hooks, schedule,
            effect=(StepEffectCheck(*args, self._namer, self._pending)
                    if on("optimizer_changes_params") or on("frozen_stay_frozen") else None),
            zero_lr=ZeroLrCheck(*args) if on("optimizer_changes_params") else None,
            arrival=ArrivalCheck(*args, self._namer, self._pending) if on("params_receive_grads") else None,
            clearing=ClearingCheck(*args, self._namer, self._pending) if on("grads_cleared") else None,
            base=hooks.count,
        )
        for check in watch.checks():
            check.meter = self._meter
        watch.part = _WatchPart(watch, self._before_step, self._after_step)
        hooks.add(watch.part)
        self._watches[id(optimizer)] = watch
        self._only = watch if len(self._watches) == 1 else None
        if self._ties is not None:
            self._ties.optimizers_changed()
        if self._discovery is not None:
            self._discovery.restart()
            self._wake()

    def offer_graph(self, loss: torch.Tensor) -> None:
        """A loss with its autograd graph: walked for its leaves on the steps before an ownership
        check (:mod:`publisher.invariants.leaves`), else left alone at once."""
        owned = self._ownership
        if owned is not None and owned.wants_graph(self.steps_done) and loss.grad_fn is not None:
            with self._meter:
                self._run(owned, owned.see_graph, loss, self.steps_done)

    def skip(self, steps: int) -> None:
        """Quiet steps pass: the hooks count them, and :meth:`InvariantLink.sync` numbers them
        (:class:`~publisher.measure.budget.QuietPart`)."""

    def idle_steps(self) -> int:
        """Coming steps after which the loss's graph is not wanted (:meth:`offer_graph`: the
        ownership check walks it on the two steps before each of its checks), so that the
        Monitor's quiet steps, which do not offer it, may run until then. Nothing else here needs
        the Monitor's full step: the hooks do their own work on every step, and the step numbering
        is synced on quiet steps too (:meth:`InvariantLink.sync`)."""
        owned = self._ownership
        if owned is None:
            return sys.maxsize
        done = self.steps_done
        return max(owned.next_due(done + 1) - done - 3, 0)

    def ignore_unowned(self, tensors: Sequence[torch.Tensor]) -> None:
        """Tensors that get gradients with no optimizer on purpose."""
        if self._ownership is not None:
            self._ownership.ignore(tensors)

    def statuses(self) -> dict[str, dict[str, Any]]:
        """Current status of each invariant: ``{name: {status, step, message, details}}``."""
        return self._board.statuses()

    @property
    def steps_done(self) -> int:
        """Optimizer steps seen so far (the most of any one optimizer)."""
        only = self._only
        if only is not None:  # the common case, read on every full step
            return only.count
        return max((watch.count for watch in self._watches.values()), default=0)

    def counted_by(self) -> tuple[StepHooks, int] | None:
        """Where the steps done are counted when one optimizer is watched: its step hooks, whose
        ``count`` less the second item is :attr:`steps_done` (None with several or none); for a
        caller that reads it on every step, where each object touched costs (:meth:`InvariantLink.sync`)."""
        only = self._only
        return None if only is None else (only.hooks, only.base)

    def overhead(self) -> dict[str, float]:
        """Wall time the checker spent in its hooks so far (its cost to training), and per step."""
        seconds = self._meter.spent_ns / 1e9
        return {"seconds": seconds, "steps": self.steps_done,
                "seconds_per_step": seconds / self.steps_done if self.steps_done else 0.0}

    def close(self) -> None:
        """Remove every hook, settle the verdicts still in flight (so the last one is reported)."""
        if self._closed:
            return
        self._closed = True
        for watch in self._watches.values():
            if watch.part is not None:
                watch.hooks.remove(watch.part)
            for check in watch.checks():
                check.close()
        for run_wide in (self._train_mode, self._discovery):
            if run_wide is not None:
                run_wide.close()
        self._pending.drain(wait=True)
        if self._replicas is not None:
            self._run(self._replicas, self._replicas.close)

    # ----------------------------------------------------------------- hooks

    # The step hooks call these on the steps the last one planned (``_plan_quiet``: the next sampled
    # step, the run-wide checks' next one, every step while a verdict is on its way); the steps
    # between cost the checker nothing (benchmarks/invariants_overhead.py).

    def _before_step(self, watch: _Watch, args: tuple, kwargs: dict, index: int) -> None:
        with self._meter:
            self._before(watch, args, kwargs, index)

    def _before(self, watch: _Watch, args: tuple, kwargs: dict, index: int) -> None:
        ties = self._ties
        if ties is not None and ties.wants_values and not ties.dead:
            with torch.no_grad():  # before the step moves anything: the values the run starts from
                self._run(ties, ties.before_step, self._owned_params(), self._step_of(watch))
        if index < watch.quiet_until:  # called for a verdict on its way, or a run-wide check
            if self._pending:
                self._drain()
            return
        schedule, clearing, effect = watch.schedule, watch.clearing, watch.effect
        if not schedule.due(index):
            if clearing is not None and clearing.has_sentinel and schedule.due(index + 1):
                self._run(clearing, clearing.before_step, index, self._step_of(watch))  # open a window
        else:
            step = self._step_of(watch)
            if clearing is not None and (clearing.armed or clearing.has_sentinel):
                self._run(clearing, clearing.before_step, index, step)
            if effect is not None:
                closure = any(callable(a) for a in args[1:]) or any(callable(v) for v in kwargs.values())
                with torch.no_grad():
                    self._run(effect, effect.before_step, index, step, closure)
        if self._pending:
            self._drain()

    def _after_step(self, watch: _Watch, index: int) -> int:
        """After step ``index`` of ``watch``'s optimizer; returns the next step its hooks call the
        checker on: that of its next sampled step (``quiet_until``), of the run-wide checks
        (``_global_quiet_until``, in steps done of any optimizer), or the next one while a verdict
        is on its way."""
        with self._meter:
            self._after(watch, index)
        if self._pending:
            return index + 1
        return min(watch.quiet_until, index + max(self._global_quiet_until - self.steps_done, 1))

    def _after(self, watch: _Watch, index: int) -> None:
        watched = watch.watched
        if index < watch.quiet_until and self.steps_done < self._global_quiet_until:
            self._drain()
            return
        arrival, clearing = watch.arrival, watch.clearing
        due = watch.schedule.due(index)
        if due or (arrival is not None and index < arrival.window_end) or (
                clearing is not None and not clearing.has_sentinel):
            self._after_sampled(watch, index, due)
        self._global_checks(watched.index, index, max(index, self.steps_done - 1))
        if self._pending:
            self._drain()
        if watched.index == 0 and index >= self.config.dense_steps and watch.schedule.regular(index):
            self._retime()
        self._plan_quiet(watch, index)

    def _retime(self) -> None:
        """At a periodic check of the first optimizer: charge what the checks cost since the
        previous one to the budget, and space the coming checks accordingly.

        Every check's work counts (the replica comparison's too, though its own period is fixed:
        every rank must join it at the same step). The first charge holds the dense first steps
        and one-off set-up, and is ignored.
        """
        spent = self._meter.spent_ns
        self._budget.charge((spent - self._spent_at_retime) / 1e9)
        self._spent_at_retime = spent
        every = self._budget.gap(self._clock.seconds if self._clock is not None else None)
        for watch in self._watches.values():
            watch.schedule.retime(every, watch.count)
        if self._train_mode is not None:
            self._train_mode.schedule.retime(every, self.steps_done)
        if self._ties is not None:
            self._ties.schedule.retime(every, self.steps_done)

    def _plan_quiet(self, watch: _Watch, index: int) -> None:
        """Work out how many coming steps need no work, so their hooks return at once.

        Per optimizer: up to the step before its next sampled one (whose pre-hook opens the
        gradient-clearing window); none while a parameter is inside its gradient window or no
        sentinel is chosen yet; for the first optimizer, the clock of the replica check, also up
        to its next comparison (every step while one is in flight). For the run-wide checks: until
        train-mode or discovery hooks must be armed (the post-hook of the step before a sampled
        one) or the next ownership check.
        """
        arrival, clearing, replicas = watch.arrival, watch.clearing, self._replicas
        quiet = watch.schedule.next_due(index + 1) - 1
        if (arrival is not None and index + 1 < arrival.window_end) or (
                clearing is not None and not clearing.has_sentinel):
            quiet = index + 1
        if watch.watched.index == 0 and replicas is not None:
            quiet = min(quiet, index + 1 if replicas.busy else replicas.schedule.next_due(index + 1))
        watch.quiet_until = quiet
        upcoming = self.steps_done
        mode, owned, discovery = self._train_mode, self._ownership, self._discovery
        marks = [upcoming + 10**9]
        if mode is not None:
            marks.append(upcoming + 1 if mode.armed else mode.schedule.next_due(upcoming + 1))
        if discovery is not None and not discovery.finished:
            marks.append(upcoming + 1 if discovery.armed else discovery.schedule.next_due(upcoming + 1))
        if owned is not None:
            marks.append(owned.next_due(upcoming))
        if self._ties is not None and not self._ties.dead:
            marks.append(self._ties.next_due(upcoming))
        self._global_quiet_until = min(marks)

    def _drain(self) -> None:
        """Hand arrived verdicts to their checks; they may ask for a step, so plan afresh."""
        self._pending.drain()
        self._wake()

    def _wake(self) -> None:
        """Plan afresh: every optimizer's hooks call the checker from its next step on."""
        self._global_quiet_until = 0
        for watch in self._watches.values():
            watch.quiet_until = 0
            if watch.part is not None:
                watch.hooks.wake(watch.part)

    def _after_sampled(self, watch: _Watch, index: int, due: bool) -> None:
        step = max(index, self.steps_done - 1)
        effect, zero_lr, arrival, clearing = watch.effect, watch.zero_lr, watch.arrival, watch.clearing
        if effect is not None and effect.has_snapshot:
            with torch.no_grad():
                self._run(effect, effect.after_step)
        if zero_lr is not None and due:
            self._run(zero_lr, zero_lr.after_step, index, step)
        if arrival is not None:
            self._run(arrival, arrival.after_step, index, step)
        if clearing is not None and not clearing.has_sentinel:
            self._run(clearing, clearing.after_step, index)

    def _global_checks(self, optimizer_index: int, index: int, step: int) -> None:
        """The checks about the model and the run rather than one optimizer."""
        upcoming = self.steps_done
        replicas, mode, owned, discovery = self._replicas, self._train_mode, self._ownership, self._discovery
        # The first optimizer is the clock of the collective check: every rank runs it at the same step.
        if optimizer_index == 0 and replicas is not None and (replicas.busy or replicas.schedule.due(index)):
            self._run(replicas, replicas.after_step, index, step)
        if mode is not None and (mode.armed or mode.schedule.due(upcoming)):
            self._run(mode, mode.after_step, step, upcoming)
        if owned is not None and owned.due(upcoming - 1):
            self._run(owned, owned.after_step, upcoming - 1, step, [root for _, root in self._roots],
                      [w.watched for w in self._watches.values()])
        if discovery is not None and not discovery.finished and (
                discovery.armed or discovery.schedule.due(upcoming)):
            self._run(discovery, discovery.after_step, upcoming)
        ties = self._ties
        if ties is not None and not ties.dead and ties.due(upcoming - 1):
            with torch.no_grad():
                self._run(ties, ties.after_step, upcoming - 1, step)

    # ----------------------------------------------------------------- internals

    def _enabled(self, name: str) -> bool:
        return name not in self.config.disabled

    def _step_of(self, watch: _Watch) -> int:
        return max(watch.count, self.steps_done - 1)

    def _announce(self, model: nn.Module | None) -> None:
        k = self.config.grad_window
        no_model = "no model given: waiting to find it at a forward"
        waiting = {
            "optimizer_changes_params": "waiting for the first optimizer step",
            "params_receive_grads": f"waiting for the first optimizer steps (window: {k} steps)",
            "grads_cleared": "waiting for two optimizer steps with backward passes between them",
            "model_in_train_mode": "waiting for a training forward" if model is not None else no_model,
            "replicas_consistent": (self._replicas.why_unchecked() if self._replicas else None)
            or "waiting for the first replica comparison",
            "optimizer_owns_trainables": f"checked after {k} optimizer steps"
            if model is not None else no_model,
            "frozen_stay_frozen": "waiting for a step of an optimizer that owns parameters with "
                                  "requires_grad=False",
            "ties_hold": "waiting for the first optimizer step" if model is not None else no_model,
        }
        for name in INVARIANT_NAMES:
            self._board.start(name, waiting[name])
            if not self._enabled(name):
                self._board.disable(name, "disabled in the invariant configuration")

    def _adopt(self, model: nn.Module, discovered: bool = False) -> None:
        """Make ``model`` (or what it wraps) a root: names, train-mode regions, ownership.

        Parameters of the given model are named by their path in it; those of discovered roots
        get the root's class name in front (``Discriminator.fc.weight``), since the user never
        said which module that is.
        """
        root = unwrap(model)
        if any(root is r for _, r in self._roots):
            return
        inside = {id(m) for m in root.modules()}
        self._roots = [(prefix, r) for prefix, r in self._roots if id(r) not in inside]
        prefix = ""
        if discovered or self._roots:
            prefix = f"{type(root).__name__}."
            used = {p for p, _ in self._roots}
            if prefix in used:
                prefix = f"{type(root).__name__}#{len(self._roots) + 1}."
        self._roots.append((prefix, root))
        self._namer.add_root(root, prefix)
        if self._discovery is not None:
            self._discovery.note_root(root)
        if self._train_mode is not None:
            self._run(self._train_mode, self._train_mode.set_roots, list(self._roots), self.steps_done)
        if self._ownership is not None and self._discovery is not None:
            self._board.idle_message("optimizer_owns_trainables",
                                     f"checked after {self.config.grad_window} optimizer steps")
        if self._ties is not None:
            self._run(self._ties, self._ties.set_roots, list(self._roots))
            self._wake()  # the next pre-step hook compares the new root's values

    def _owned_params(self) -> list[torch.Tensor]:
        """Every watched optimizer's parameters, each once."""
        owned: dict[int, torch.Tensor] = {}
        for watch in self._watches.values():
            watch.watched.refresh()
            for p in watch.watched.params:
                owned.setdefault(id(p), p)
        return list(owned.values())

    def _owned_ids(self) -> set[int]:
        owned: set[int] = set()
        for watch in self._watches.values():
            watch.watched.refresh()
            owned.update(id(p) for p in watch.watched.params)
        return owned

    def _replica_params(self) -> list[tuple[str, torch.Tensor]]:
        """What replicas compare: the model's parameters, else every optimizer's (fixed at setup)."""
        named: dict[int, tuple[str, torch.Tensor]] = {}
        for prefix, root in self._roots:
            for name, p in root.named_parameters():
                named.setdefault(id(p), (prefix + name, p))
        if not named:
            for watch in self._watches.values():
                w = watch.watched
                for i, param in enumerate(w.params):
                    named.setdefault(id(param), (w.label(self._namer, i), param))
        return list(named.values())

    def _run(self, check: Check, method: Callable[..., None], *args: Any) -> None:
        if check.dead:
            return
        try:
            method(*args)
        except Exception as exc:
            self._fail(check, exc)

    def _fail(self, check: Check, exc: BaseException) -> None:
        """Switch a broken check off: training goes on, its invariants say why they are unchecked."""
        check.dead = True
        _log.warning("invariant check %s failed and is switched off", type(check).__name__, exc_info=exc)
        try:
            check.close()
        finally:
            for name in check.names:
                self._board.disable(name, f"internal error, check switched off: {exc!r}")
