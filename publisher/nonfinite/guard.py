"""``NonFiniteGuard``: the gradients checked before the optimizer applies them, and what follows.

An optimizer step pre-hook looks at the step's gradient norms before ``optimizer.step()`` moves
anything. They are the Monitor's own gradient norm, measured here instead of after the step
(same gradients, same number, one fused ``_foreach_norm``), so a healthy step pays nothing more.
What is checked when:

- On the CPU, with the default ``on_nonfinite="report"``: every step's loss. Each one-number
  tensor backpropagated is told to the guard by the ``Tensor.backward`` watch of
  :mod:`publisher.patches.torch_calls` before its backward runs, on the host already; a loss that
  is not finite, or :data:`LOSS_JUMP` times its recent level (a diverging run: the loss of the
  step whose gradients overflow may still be finite), has that step's gradients measured before
  its update whatever the gradient norm's budget; the other steps have them measured as the budget
  allows. To re-run the step that went wrong, its model calls must have been kept (a forward hook
  on the model's root): on every step where a step takes :data:`EVERY_STEP_FROM_S` or more (the
  hook sends each forward down torch's slow call path, ~15 µs here), on faster steps on those whose
  norm is due and the short gaps between them (:data:`ARMED_GAP`); a poisoned fast step between
  them is still caught before its update, and its event says its calls were not kept.
- On a GPU with ``"report"``: nothing before the update. Reading a loss or a norm there waits for
  the device; the step's loss and gradient norm reach the host with its other numbers one fetch
  later, and the detectors report the step then (``nonfinite_loss``, ``nonfinite_grad``), without
  an origin.
- With ``"skip"`` or ``"stop"`` (the user asked for the step to be acted on): the gradient norm of
  every step, on a GPU at the price of one sync per step, as ``torch.amp.GradScaler`` pays it for
  its ``found_inf``.

On the first non-finite step of an episode the step is re-run (:mod:`publisher.nonfinite.origin`)
and a repro bundle written (:mod:`publisher.nonfinite.bundle`), then one ``nonfinite_origin``
event says where it came from. Then the policy:

- ``report``: nothing changes in training.
- ``skip``: the update is dropped, as ``GradScaler.step`` drops it by not calling
  ``optimizer.step()``: for that one call every parameter's ``.grad`` is set to None, which
  torch's optimizers read as "no gradient, no update" (no parameter, no optimizer state moves;
  the step counter of Adam's state neither), and the post-hook puts the gradients back for the
  caller's ``zero_grad`` and the Monitor's reading. Skipped steps are counted
  (``nonfinite_skipped``).
- ``stop``: :class:`NonFiniteStop` is raised out of ``optimizer.step()`` once the evidence is saved.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from publisher.detectors.base import Finding
from publisher.detectors.episodes import EpisodeTracker
from publisher.measure.step_hooks import StepHooks, hooks_on
from publisher.nonfinite import bundle
from publisher.nonfinite.capture import CALLS_KEPT, StepCapture
from publisher.nonfinite.origin import find_origin
from publisher.patches import torch_calls
from publisher.stats.grad_norm import GradNorms
from publisher.wire.repro_bundle import POLICIES

#: Episodes analysed (re-run and bundled) per run: a deterministic bug that fires every few
#: hundred steps under ``skip`` is told once it is seen a few times.
MAX_ANALYSES = 3
KIND = "nonfinite_origin"
#: Unchecked steps (``report``) the model's hook stays on through, between two checked ones on
#: steps faster than :data:`EVERY_STEP_FROM_S` (else it is off from the first to the last, put back
#: by the update before a checked step). Kept on, it costs each such forward ~8 us on a ~1 ms CPU
#: MLP step (torch's slow call path, the call kept, then dropped); taken off and put back, ~5-15 us
#: for the two changes.
ARMED_GAP = 2
#: Steps this long or longer (the typical step, ``StepClock``) keep the model's calls on every step
#: under ``report`` on the CPU: the hook's ~15 µs (a ~1 ms MLP's forward, hooked and bare,
#: alternating: 200 against 186 µs) is then at most 1 % of the step, the share the other budgeted
#: measurements take together.
EVERY_STEP_FROM_S = 0.0015
_CALLS_NOT_KEPT = ("it was caught before its update, but its model calls were not kept (on steps under "
                   f"{EVERY_STEP_FROM_S * 1e3:g} ms the hook that keeps them is on only where the gradient "
                   "norm is due; grad_norm_budget=1.0, `tuimon run --grad-norm-budget 1`, keeps every "
                   "step's)")
#: A step whose loss is this many times its recent level has its gradients checked before the
#: update, whatever the gradient norm's budget: a diverging run's losses grow by orders of magnitude
#: a step (a learning rate 2,000x too high: 2, 2.4e3, 3.5e9, 2e21, 1.6e35, then NaN), and the
#: step whose gradients overflow may still have a finite loss. Megatron-LM's rerun machine flags a
#: loss 10x the largest of its first 100 as a spike; a check here costs a norm, not an alarm.
LOSS_JUMP = 100.0
#: The weight of the newest loss in its recent level (an exponential moving average of ``|loss|``),
#: and the steps that make the level before a jump counts.
LEVEL_ALPHA = 0.1
LEVEL_STEPS = 5
#: Steps after a loss jump within which a non-finite step counts as the same divergence.
DIVERGING_STEPS = 10


class NonFiniteStop(RuntimeError):
    """Training stopped on a non-finite step (``on_nonfinite="stop"``), after the evidence was saved."""


@dataclass
class GuardSettings:
    """What the guard is told by the Monitor."""

    policy: str
    run: str
    rank: int
    record: Path | None
    seed: int | None
    repro_weights: bool

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"on_nonfinite must be one of {POLICIES}, got {self.policy!r}")


def nonfinite_words(origin: dict[str, Any], step: int, diverging: dict[str, float] | None = None) -> str:
    """The origin in words, with what to do next. ``diverging``: the loss rose by orders of magnitude
    just before (``from_step``, ``factor``): where no module reproduces the non-finite values, an
    overflow of a diverging run is the likelier cause than a fault."""
    if diverging is not None and (origin.get("module") == "loss" or not origin.get("reproduced")):
        since = int(diverging["from_step"])
        return (f"the gradients overflowed at step {step} (their norm is not finite) while the run "
                f"diverged: the loss rose {diverging['factor']:.1e}x from step {since}; most often a "
                "learning rate far too high (or a loss scale, an unclipped gradient), not a bug in one "
                "module")
    if not origin.get("rerun"):
        return f"non-finite gradients at step {step}; could not re-run the step: {origin.get('why')}"
    if origin.get("module") == "loss":
        return (f"non-finite gradients at step {step} from outside the model: its forward and backward "
                "re-run finite and its output was finite, so the loss function produced them (a log of 0, a "
                "division by a zero count), or a one-off fault in the backward did; call the loss on the "
                "bundle's outputs")
    if not origin.get("reproduced"):
        return (f"non-finite gradients at step {step}, but a re-run of the step on the same inputs and RNG "
                f"state is finite ({origin.get('why')}): not the code. A transient fault: silent data "
                "corruption, a flaky device or a race; check the node's health (runbook) and keep the "
                "repro bundle" + ("" if origin.get("rng_kept", True) else
                                  " (the CPU RNG state was not kept, the model having no dropout module: a "
                                  "forward that draws random numbers by hand re-ran with others)"))
    module, phase = origin["module"], origin["phase"]
    if module == "input":
        return (f"non-finite values at step {step} come from the model's inputs: the batch holds NaN or Inf "
                "(a corrupt record, a bad transform); the repro bundle holds it")
    return (f"non-finite values start in the {phase} of {module} ({origin['class']}) at step {step}, its "
            f"inputs finite; the re-run on the same inputs and RNG state reproduces it: a bug in that "
            f"module's {phase} for this input")


class NonFiniteGuard:
    """Checks each step's gradients before the update; re-runs, bundles and acts on a bad one."""

    def __init__(
        self,
        settings: GuardSettings,
        *,
        measure: Callable[[bool], GradNorms | None],
        current_step: Callable[[], int],
        tracker: EpisodeTracker,
        batch: Callable[[], Any],
        on_error: Callable[[str, BaseException], None],
        step_seconds: Callable[[], float | None] = lambda: None,
        roots: Callable[[], Iterable[torch.nn.Module]] = tuple,
    ) -> None:
        self.settings = settings
        self._roots = roots
        self.capture = StepCapture()
        self.skipped = 0
        #: The gradient norms measured before this step's update (the Monitor reports them).
        self.norms: GradNorms | None = None
        self._measure = measure
        self._current_step = current_step
        self._tracker = tracker
        self._batch = batch
        self._on_error = on_error
        self._step_seconds = step_seconds
        #: The losses backpropagated since the last update, read on the host (told by the backward
        #: watch), and whether one of them has this step's gradients checked before its update.
        self._losses: list[float] = []
        self._losses_step = 0  # the optimizer step they belong to
        self._flagged = False
        self._loss: float | None = None  # the step's loss as read before the update
        self._loss_level: float | None = None
        self._levels = 0
        #: The run of loss jumps under way: the step it started at and the level before it (None: none).
        self._jumps: tuple[int, float, int] | None = None  # (first step, level before, latest step)
        torch_calls.on_backward(self._saw_loss)
        #: Whether the norms were measured before this step's update (None is then "not due").
        self.measured = False
        self._acting = settings.policy != "report"
        #: The Monitor's number of the next step whose gradient norms are due (its budget, or a
        #: sampled step): with ``report`` the check runs on those steps only. The first is checked.
        self._due_step = 0
        self._hooks: list[StepHooks] = []
        self._in_episode = False
        self._analyses = 0
        self._stashed: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        #: Whether the gradient norms were last on the host (a CPU run, where ``report`` reads
        #: them); True until a step says otherwise.
        self._host_norms = True

    def watch(self, optimizer: torch.optim.Optimizer) -> None:
        """Check the steps of ``optimizer`` too (a part of its shared step hooks:
        :mod:`publisher.measure.step_hooks`)."""
        self._hooks.append(hooks_on(optimizer).add(self))

    def close(self) -> None:
        torch_calls.off_backward(self._saw_loss)
        for hooks in self._hooks:
            hooks.remove(self)
        self._hooks.clear()
        self.capture.close()

    def idle_steps(self) -> int:
        """Coming steps on which :meth:`next_step` has nothing to do: ``report``, the model's roots
        hooked, and steps before the next checked one (the update before it puts the model's hook
        back where it is off: a step whose update does not run, as ``GradScaler`` skips one,
        leaves the checked step's calls unkept, and a non-finite one then unexplained)."""
        if self._acting or not self.capture.roots:
            return 0
        return max(self._due_step - self._current_step() - 1, 0)

    def skip(self, steps: int) -> None:
        """Quiet steps pass: the guard's hooks count them (:class:`~publisher.measure.budget.QuietPart`)."""

    def next_step(self, due_in: int) -> None:
        """The Monitor recorded the step (one call a step: each costs microseconds there); its
        norms are due ``due_in`` steps after the next one (0: on the next). This step's calls and
        norms are no longer needed; the model's roots, once discovered, are hooked; the model's
        calls are kept only where gradients will be checked (``skip``/``stop``: every step;
        ``report``: where the norms are measured and read on the host), its hook left on after one
        of those through a gap of up to :data:`ARMED_GAP` steps before the next (their calls are
        dropped unchecked), so that the other steps' forwards run without a hook (put back on by
        the update before a checked step, :meth:`before_step`, or here when the next is one)."""
        capture = self.capture
        self._due_step = self._current_step() + 1 + due_in
        if self.measured:
            self.norms = None
            self.measured = False
        if capture.calls:
            capture.clear()
        if not capture.roots:
            for root in self._roots():
                capture.attach(root)
        seconds = self._step_seconds()
        every_step = seconds is not None and seconds >= EVERY_STEP_FROM_S
        capture.arm(self._acting or (self._host_norms and (
            every_step or due_in == 0 or (capture.armed and due_in <= ARMED_GAP))))
        # The hooks call this guard on every step while the model's calls are kept (they are
        # dropped there), else from the update before the checked step (which arms the capture).
        wait = 0 if capture.armed else max(due_in - 1, 0)
        for hooks in self._hooks:
            hooks.call_at(self, hooks.count + wait)

    # -- the hooks ------------------------------------------------------------------------------

    def before_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict, index: int) -> None:
        suspicious, self._flagged = self._flagged, False
        losses, self._losses = self._losses, []
        self._loss = sum(losses) / len(losses) if losses else None
        if not self._acting:
            steps_to_due = self._due_step - self._current_step() - 1
            if steps_to_due > 0 and not suspicious:  # ``report``, norms not due: step() counts it
                capture = self.capture
                if capture.calls:  # kept through a gap between checked steps: not needed
                    capture.clear()
                if steps_to_due == 1 and self._host_norms and not capture.armed:
                    capture.arm(True)  # the next step is checked: its forward's calls are kept
                return
        if kwargs and "found_inf" in kwargs:
            # GradScaler hands a fused optimizer its scaled gradients and the verdict on them: an
            # overflow there is the scaler's to skip, as it does, not a fault.
            return
        try:
            self._check(optimizer, suspicious)
        except NonFiniteStop:
            raise
        except Exception as exc:  # never break the user's training because of telemetry
            self._on_error("non-finite check", exc)

    def _saw_loss(self, loss: torch.Tensor) -> None:
        """A loss is about to be backpropagated (training thread, told by the backward watch): on the
        host it is read (a CPU scalar: no wait), and one that says the step's gradients may be bad
        has them checked before this step's update (its hooks call :meth:`before_step` then)."""
        if not (self._host_norms and loss.is_cpu) or loss.is_complex():
            return
        value = float(loss.item())
        step = self._hooks[0].count if self._hooks else 0
        if step != self._losses_step:  # the first loss of a step (the guard was not called on the last)
            self._losses_step, self._losses, self._flagged = step, [], False
        if len(self._losses) < CALLS_KEPT:
            self._losses.append(value)
        if self._suspicious(value) and not self._flagged:
            self._flagged = True
            for hooks in self._hooks:
                hooks.wake(self)

    def _suspicious(self, loss: float) -> bool:
        """Whether ``loss`` says the step's gradients may be bad: not finite, or :data:`LOSS_JUMP`
        times its recent level once that is known (every finite loss moves the level)."""
        if not math.isfinite(loss):
            return True
        size, level = abs(loss), self._loss_level
        self._loss_level = size if level is None else level + LEVEL_ALPHA * (size - level)
        self._levels += 1
        if level is None or self._levels <= LEVEL_STEPS or size <= LOSS_JUMP * level:
            return False
        step, jumps = self._current_step() + 1, self._jumps
        if jumps is None or step - jumps[2] > DIVERGING_STEPS:
            jumps = (step, level, step)
        self._jumps = (jumps[0], jumps[1], step)
        return True

    def _diverging(self, step: int) -> dict[str, float] | None:
        """The run of loss jumps that ``step`` belongs to or follows closely, where there is one."""
        jumps = self._jumps
        if jumps is None or step - jumps[2] > DIVERGING_STEPS or self._loss_level is None:
            return None
        loss = self._loss if self._loss is not None and math.isfinite(self._loss) else self._loss_level
        return {"from_step": jumps[0], "factor": abs(loss) / max(jumps[1], 1e-30)}

    def _check(self, optimizer: torch.optim.Optimizer, suspicious: bool = False) -> None:
        acting = self._acting
        norms = self.norms = self._measure(acting or suspicious)
        self.measured = True
        if norms is None:
            return
        self._host_norms = norms.total.is_cpu
        if not (self._host_norms or acting):
            return
        if math.isfinite(norms.total.item()):
            if self._in_episode:  # the episode's event closes with the first finite step
                self._in_episode = False
                self._tracker.observe(self, self._current_step() + 1, (), quiet_to_close=1)
            return
        step = self._current_step() + 1
        if not self._in_episode:
            self._in_episode = True
            self._analyse(optimizer, step)
        if self.settings.policy == "skip":
            self._skip(optimizer)
        elif self.settings.policy == "stop":
            raise NonFiniteStop(f"tuimon: non-finite gradients at step {step}; training stopped before the "
                                "update (on_nonfinite='stop'); the repro bundle and the event say more")

    def after_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict, index: int) -> int:
        """The gradients a skipped update hid are put back; called on the next step too, until
        :meth:`next_step` says when the next check is due (a run whose Monitor never steps is
        checked on every step)."""
        if self._stashed:
            for param, grad in self._stashed:
                param.grad = grad
            self._stashed = []
        return index + 1

    def _skip(self, optimizer: torch.optim.Optimizer) -> None:
        """No gradient for this one call: the optimizer updates nothing (put back after it)."""
        self._stashed = [(p, p.grad) for group in optimizer.param_groups for p in group["params"]]
        for param, _ in self._stashed:
            param.grad = None
        self.skipped += 1

    def _analyse(self, optimizer: torch.optim.Optimizer, step: int) -> None:
        """Re-run the step, write the bundle, publish the event (once per episode, a few per run)."""
        if self._analyses >= MAX_ANALYSES:
            return
        self._analyses += 1
        settings = self.settings
        calls = list(self.capture.calls)
        try:
            if not calls and self.capture.roots and not self.capture.armed:
                origin = {"rerun": False, "reproduced": None, "why": _CALLS_NOT_KEPT}
            else:
                origin = find_origin(calls)
        except Exception as exc:  # a model the re-run cannot drive: said in the event
            origin = {"rerun": False, "reproduced": None,
                      "why": f"the re-run failed ({type(exc).__name__}: {exc})"}
        lr = optimizer.param_groups[0].get("lr") if optimizer.param_groups else None
        facts = {"run": settings.run, "rank": settings.rank, "step": step, "loss": self._loss,
                 "lr": float(lr) if isinstance(lr, float | int | torch.Tensor) else None,
                 "grad_norm": self.norms.total.item() if self.norms is not None else None,
                 "policy": settings.policy}
        diverging = self._diverging(step)
        if diverging is not None:
            facts["diverging"] = diverging
        path = bundle.bundle_path(settings.record, settings.run, settings.rank, step)
        weights = calls[0].module if settings.repro_weights and calls else None
        details: dict[str, Any] = {**facts, "origin": origin}
        message = nonfinite_words(origin, step, diverging)
        try:
            details["repro"] = str(bundle.write(path, facts=facts, origin=origin, batch=self._batch(),
                                                calls=calls, seed=settings.seed, weights_of=weights))
            message += f"; repro bundle {path.name}"
        except OSError as exc:
            details["repro"] = None
            details["repro_error"] = str(exc)
        if settings.policy == "skip":
            message += "; the update is skipped"
        elif settings.policy == "stop":
            message += "; training stops"
        # An episode's event, as the detectors' are (one per episode, with the run's replay record).
        self._tracker.observe(self, step, [Finding(KIND, message, details)], quiet_to_close=1)
