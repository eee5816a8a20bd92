"""The parts of the model being trained run in training mode (``model_in_train_mode``).

What would cry wolf, and how it is avoided:

* Evaluation: forwards under ``no_grad``/``inference_mode`` are not looked at, and only the last
  grad-enabled forward before an optimizer step counts (an eval loop that forgot ``no_grad``
  and is followed by ``model.train()`` is fine).
* Modes that change nothing: only subtrees holding a mode-dependent module count (dropout with
  p > 0, batch/instance norm tracking running stats, RNN/attention dropout).
* Deliberate eval parts: a frozen backbone kept in ``eval()`` has no trainable parameter in its
  subtree; batch-norm layers put in ``eval()`` one by one to freeze their statistics are leaves.
  Neither counts. What counts is a *container* module (one with children) in eval mode whose
  subtree holds trainable parameters and a mode-dependent module in eval mode: the whole model,
  or an encoder, left in ``eval()`` after an evaluation.
* One odd forward: a finding must repeat on the next checked step (requested at once).

The forward pre-hook is on the root and its direct children that hold mode-dependent modules (not
on every module), and only installed for sampled steps.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from publisher.detectors.base import name_list
from publisher.invariants.config import InvariantConfig
from publisher.invariants.core import StatusBoard
from publisher.measure.budget import Schedule
from publisher.measure.check import Check

MODE = "model_in_train_mode"


def mode_dependent(module: nn.Module) -> bool:
    """Does ``module`` compute differently in train and eval mode?"""
    if isinstance(module, nn.modules.dropout._DropoutNd):
        return module.p > 0
    if isinstance(module, (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)):
        return bool(module.track_running_stats)
    if isinstance(module, nn.RNNBase):
        return module.dropout > 0 and module.num_layers > 1
    if isinstance(module, nn.MultiheadAttention):
        return module.dropout > 0
    return False


class _Region:
    """A container module and the mode-dependent modules below it."""

    __slots__ = ("dependents", "module", "name", "path")

    def __init__(self, name: str, path: str, module: nn.Module, dependents: list[nn.Module]) -> None:
        self.name, self.path, self.module, self.dependents = name, path, module, dependents

    def inside(self, other: _Region) -> bool:
        return other.path == "" or self.path.startswith(other.path + ".")


class _Root:
    """A root module, its regions, and the modules whose forward pre-hook sees it run.

    The targets are the root and its children that are regions themselves: a container given as
    the model (a GAN's ModuleDict) is never called itself, its children are.
    """

    __slots__ = ("module", "regions", "targets")

    def __init__(self, prefix: str, module: nn.Module) -> None:
        self.module = module
        self.regions: list[_Region] = []
        for name, sub in module.named_modules():
            if next(sub.children(), None) is None:
                continue
            dependents = [m for m in sub.modules() if mode_dependent(m)]
            if dependents:
                label = prefix + name if name else (prefix.rstrip(".") or "model")
                self.regions.append(_Region(label, name, sub, dependents))
        regions = {id(region.module) for region in self.regions}
        self.targets = [module] + [child for child in module.children() if id(child) in regions]


class TrainModeCheck(Check):
    names = (MODE,)

    def __init__(self, board: StatusBoard, config: InvariantConfig) -> None:
        self._board = board
        self.schedule = Schedule(config.dense_steps, config.check_every)
        self._roots: list[_Root] = []
        self._handles: list = []
        self._findings: dict[int, list[str]] = {}
        self._suspects: dict[int, set[str]] = {}

    def set_roots(self, roots: list[tuple[str, nn.Module]], next_index: int) -> None:
        """(Re)build the regions to watch; ``roots`` are (name prefix, unwrapped module)."""
        self._disarm()
        self._roots = [_Root(prefix, root) for prefix, root in roots]
        if not any(root.regions for root in self._roots):
            self._board.idle_message(MODE, "the model has no module whose behaviour depends on train/eval "
                                           "mode (dropout, batch norm): nothing to check")
            return
        self._board.idle_message(MODE, "waiting for a training forward on a sampled step")
        if self.schedule.due(next_index):
            self._arm()

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def after_step(self, step: int, next_index: int) -> None:
        """Called while armed and before sampled steps: judge what the forwards saw, (dis)arm."""
        findings, self._findings = self._findings, {}
        for root_index, offenders in findings.items():
            self._judge(step, next_index, root_index, offenders)
        if not self._roots:
            return
        if self.schedule.due(next_index):
            self._arm()
        else:
            self._disarm()

    def close(self) -> None:
        self._disarm()

    def _arm(self) -> None:
        if self._handles:
            return
        for i, root in enumerate(self._roots):
            if root.regions:
                hook = partial(self._on_forward, i)
                self._handles += [target.register_forward_pre_hook(hook) for target in root.targets]

    def _disarm(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _on_forward(self, root_index: int, module: nn.Module, args: tuple) -> None:
        if not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
            return
        with self.meter:
            self._look(root_index)

    def _look(self, root_index: int) -> None:
        offenders: list[_Region] = []
        # named_modules order: containers come before their children.
        for region in self._roots[root_index].regions:
            if region.module.training or any(region.inside(o) for o in offenders):
                continue
            if any(not m.training for m in region.dependents) and any(
                p.requires_grad for p in region.module.parameters()
            ):
                offenders.append(region)
        # The last training forward before the step wins.
        self._findings[root_index] = [region.name for region in offenders]

    def _judge(self, step: int, next_index: int, root_index: int, offenders: list[str]) -> None:
        suspects = self._suspects.get(root_index, set())
        self._suspects[root_index] = set(offenders)
        if not offenders:
            self._board.report(MODE, root_index, "ok", step,
                               "trained modules were in training mode at the last checked training forward")
            return
        confirmed = sorted(set(offenders) & suspects)
        if not confirmed:
            self.schedule.request(next_index)
            return
        message = (f"{name_list(confirmed)} in eval() mode while its trainable parameters are updated "
                   "(dropout/batch norm behave as in evaluation)")
        details = {"modules": confirmed[:50],
                   "likely_causes": ["model.eval() for an evaluation pass without model.train() afterwards",
                                     "a library call that switches the model to eval mode"]}
        self._board.violation(MODE, root_index, step, message, details, confirmed)
