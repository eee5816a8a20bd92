"""``StepCapture``: the model's calls of the current step, kept by reference for a re-run.

One forward hook on each root module (``with_kwargs``) keeps the arguments of its calls and its
outputs that require a gradient (references: the tensors live anyway until the backward is done,
nothing is copied); the outputs say whether the real step's forward was finite (a re-run that is
finite where they were not did not reproduce it). A model with a dropout module draws random
numbers in its forward, so for it a pre-hook also keeps the RNG states at the call (the CPU
generator's, a 5 KB tensor, and CUDA's where CUDA is in use) and dropout replays exactly. A model
without one draws none, as a rule, and pays one hook: the CPU state's copy alone cost 1.5 % of a
1.4 ms CPU step (a ~1 ms MLP, alternating blocks in one process: 1.089x with it, 1.074x without).
A forward that draws random numbers by hand (noise injected without a dropout module) re-runs
with other numbers, which the event says (``rng_kept``).

The hooks are on only for a step whose gradients will be checked, and a short gap between two of
them (:meth:`StepCapture.arm`, from the update before a checked step or the end of a full step:
``NonFiniteGuard``): a forward hook of any kind sends every forward down torch's slow call
path, ~11 us of a ~250 us CPU forward (an MLP's forward alone, with and without it,
alternating). Nothing more is kept: a tensor hook to keep the gradient at the outputs cost ~2 %
of a 1.7 ms CPU step (measured, ABBA blocks), so the re-run's backward starts from a gradient of
its own (:mod:`~publisher.nonfinite.origin`). Calls are forgotten at each step's end (an unchecked
step's before its update); the last :data:`CALLS_KEPT` of a step are kept (gradient
accumulation). Calls whose outputs need no gradient (evaluation) are not kept.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten
from torch.utils.hooks import RemovableHandle

from publisher.measure.tensors import unwrap

#: The CPU generator's state and every CUDA device's (None where CUDA is not in use).
RngStates = tuple[torch.Tensor, list[torch.Tensor] | None]

#: Model calls kept per step (micro-batches of gradient accumulation).
CALLS_KEPT = 8


class ModelCall:
    """One call of a root module: its arguments, the RNG states before it (None where they were
    not kept), its output tensors that require a gradient (a plain class with slots: one is made
    per forward)."""

    __slots__ = ("args", "cpu_rng", "cuda_rng", "kwargs", "module", "outputs")

    def __init__(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 outputs: list[torch.Tensor], rng: RngStates | None) -> None:
        self.module, self.args, self.kwargs, self.outputs = module, args, kwargs, outputs
        self.cpu_rng: torch.Tensor | None = rng[0] if rng is not None else None
        self.cuda_rng: list[torch.Tensor] | None = rng[1] if rng is not None else None


def cuda_rng_states() -> list[torch.Tensor] | None:
    """Every CUDA device's generator state, when CUDA is in use (else None: nothing to touch)."""
    return torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None


class StepCapture:
    """Keeps the current step's model calls; attach roots as they become known."""

    def __init__(self) -> None:
        self.calls: deque[ModelCall] = deque(maxlen=CALLS_KEPT)
        self.roots: list[nn.Module] = []
        self._handles: list[RemovableHandle] = []
        self._random: set[int] = set()  # roots with a dropout module: their RNG states are kept
        #: Whether the hooks are on (:meth:`arm`); the first step is checked.
        self.armed = True
        #: The RNG states at the start of each random root's current call, by the root's id.
        self._rng: dict[int, RngStates] = {}

    def attach(self, root: nn.Module) -> None:
        """Watch the calls of ``root`` (its inner module, inside DDP or ``torch.compile``)."""
        root = unwrap(root)
        if any(root is known for known in self.roots):
            return
        self.roots.append(root)
        if any("Dropout" in type(m).__name__ for m in root.modules()):
            self._random.add(id(root))
        if self.armed:
            self._hook(root)

    def arm(self, on: bool) -> None:
        """Keep the next step's calls (``on``) or leave its forwards alone: the hooks are added or
        removed when this changes, a few microseconds on the steps where it does."""
        if on == self.armed:
            return
        self.armed = on
        if on:
            for root in self.roots:
                self._hook(root)
        else:
            self._unhook()

    def _hook(self, root: nn.Module) -> None:
        if id(root) in self._random:
            self._handles.append(root.register_forward_pre_hook(self._before))
        self._handles.append(root.register_forward_hook(self._after, with_kwargs=True))

    def _unhook(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._rng.clear()

    def clear(self) -> None:
        """The step is over: its calls are no longer needed."""
        self.calls.clear()

    def close(self) -> None:
        self._unhook()
        self.calls.clear()

    def _before(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        self._rng[id(module)] = (torch.get_rng_state(), cuda_rng_states())

    def _after(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        rng = self._rng.pop(id(module), None)
        if isinstance(output, torch.Tensor):
            outputs = [output] if output.requires_grad else []
        else:
            outputs = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
        if outputs:  # else evaluation, or under no_grad: nothing to re-run a backward from
            self.calls.append(ModelCall(module, args, kwargs, outputs, rng))
