"""``NonFiniteGuard``: the gradients checked before the optimizer applies them, and what follows.

An optimizer step pre-hook looks at the step's gradient norms before ``optimizer.step()`` moves
anything. They are the Monitor's own gradient norm, measured here instead of after the step
(same gradients, same number, one fused ``_foreach_norm``), so a healthy step pays nothing more:
on the steps its budget allows with ``on_nonfinite="report"``, on every step with ``"skip"`` or
``"stop"`` (the user asked for the step to be acted on). On a CPU the total is a host number; on
a GPU reading it waits for the device, so with ``"report"`` it is not read there (the existing
detectors report the step, one fetch later, without an origin), and with ``"skip"`` or
``"stop"`` one sync per step is the price, as ``torch.amp.GradScaler`` pays it for its
``found_inf``. On a CPU step whose norm the budget skips, nothing is checked: a NaN
born there is seen at the next norm, and the re-run then says that the weights were already
non-finite rather than blame a module (``grad_norm_budget=1.0``, or ``skip``/``stop``, check
every step).

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
from publisher.nonfinite.capture import StepCapture
from publisher.nonfinite.origin import find_origin
from publisher.stats.grad_norm import GradNorms
from publisher.wire.repro_bundle import POLICIES

#: Episodes analysed (re-run and bundled) per run: a deterministic bug that fires every few
#: hundred steps under ``skip`` is told once it is seen a few times.
MAX_ANALYSES = 3
KIND = "nonfinite_origin"
#: Unchecked steps (``report``) the model's hook stays on through, between two checked ones (else
#: it is off from the first to the last, put back by the update before a checked step). Kept on,
#: it costs each such forward ~8 us on a ~1 ms CPU MLP step (torch's slow call path, the call
#: kept, then dropped); taken off and put back, ~5-15 us for the two changes.
ARMED_GAP = 2


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


def nonfinite_words(origin: dict[str, Any], step: int) -> str:
    """The origin in words, with what to do next."""
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
        loss: Callable[[], float | None],
        on_error: Callable[[str, BaseException], None],
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
        self._loss = loss
        self._on_error = on_error
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
        capture.arm(self._acting or (self._host_norms and (
            due_in == 0 or (capture.armed and due_in <= ARMED_GAP))))
        # The hooks call this guard on every step while the model's calls are kept (they are
        # dropped there), else from the update before the checked step (which arms the capture).
        wait = 0 if capture.armed else max(due_in - 1, 0)
        for hooks in self._hooks:
            hooks.call_at(self, hooks.count + wait)

    # -- the hooks ------------------------------------------------------------------------------

    def before_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict, index: int) -> None:
        if not self._acting:
            steps_to_due = self._due_step - self._current_step() - 1
            if steps_to_due > 0:  # ``report`` on a step whose norms are not due: step() counts it
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
            self._check(optimizer)
        except NonFiniteStop:
            raise
        except Exception as exc:  # never break the user's training because of telemetry
            self._on_error("non-finite check", exc)

    def _check(self, optimizer: torch.optim.Optimizer) -> None:
        acting = self._acting
        norms = self.norms = self._measure(acting)
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
            origin = find_origin(calls)
        except Exception as exc:  # a model the re-run cannot drive: said in the event
            origin = {"rerun": False, "reproduced": None,
                      "why": f"the re-run failed ({type(exc).__name__}: {exc})"}
        lr = optimizer.param_groups[0].get("lr") if optimizer.param_groups else None
        facts = {"run": settings.run, "rank": settings.rank, "step": step, "loss": self._loss(),
                 "lr": float(lr) if isinstance(lr, float | int | torch.Tensor) else None,
                 "grad_norm": self.norms.total.item() if self.norms is not None else None,
                 "policy": settings.policy}
        path = bundle.bundle_path(settings.record, settings.run, settings.rank, step)
        weights = calls[0].module if settings.repro_weights and calls else None
        details: dict[str, Any] = {**facts, "origin": origin}
        message = nonfinite_words(origin, step)
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
