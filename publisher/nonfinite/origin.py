"""The first module that produced a non-finite value: found by re-running the step's model calls.

For each call the step made (:mod:`~publisher.nonfinite.capture`), with the RNG state it had,
the root's forward runs again with a forward pre-hook and a forward hook on every module: the
first module, in execution order, whose output is non-finite while its inputs were finite is the
forward origin (a module whose *inputs* are already non-finite, from its caller's own code
between two submodules, names that caller; inputs of the model itself that are non-finite name
``input``: the batch). If the forward is finite, the backward runs from the gradient of the
outputs' mean (the loss function is not known; a singular derivative shows whatever gradient
reaches it), with tensor hooks on every module's outputs, inputs and own parameters: the first
module whose input or parameter gradient is non-finite while the gradient at its outputs was
finite is the backward origin. A re-run that is finite where the step's own output was not did
not reproduce it: hardware or a race, not the code (Megatron-LM's rerun state machine,
``megatron/core/rerun_state_machine.py``, re-runs a step for the same verdict); one that is
finite where the step's output was finite too leaves the loss function, which is not re-run, or
a one-off fault in the backward: ``module: "loss"``, ``reproduced: null``.

The re-run synchronises with the device (each check reads a flag): it runs only on the step of
an anomaly. It restores what it touches: module buffers (BatchNorm statistics), the parameters'
``.grad``, the torch RNG states, each module's training mode.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten
from torch.utils.hooks import RemovableHandle

from publisher.nonfinite.capture import ModelCall, cuda_rng_states


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def _finite(tensors: list[torch.Tensor]) -> bool:
    """All values finite (integer tensors always are); one device sync per call."""
    floats = [t for t in tensors if t.is_floating_point() or t.is_complex()]
    return all(bool(torch.isfinite(t.detach()).all()) for t in floats)


@dataclass
class _Search:
    """The first non-finite place seen while re-running one call."""

    names: dict[int, str]
    stack: list[nn.Module] = field(default_factory=list)
    found: dict[str, Any] | None = None
    finite_out: set[int] = field(default_factory=set)  # modules whose output gradients were all finite
    bad_out: set[int] = field(default_factory=set)
    handles: list[RemovableHandle] = field(default_factory=list)  # tensor hooks, removed after the re-run

    def name(self, module: nn.Module) -> dict[str, Any]:
        return {"module": self.names.get(id(module), type(module).__name__), "class": type(module).__name__}

    def forward_found(self, module: nn.Module, why: str) -> None:
        if self.found is None:
            self.found = {**self.name(module), "phase": "forward", "inputs_finite": True, "why": why}

    def backward_found(self, module: nn.Module, what: str) -> None:
        if self.found is None and id(module) not in self.bad_out:
            why = f"its {what} gradient is non-finite while the gradient at its output was finite"
            self.found = {**self.name(module), "phase": "backward", "inputs_finite": True, "why": why}


def module_names(root: nn.Module) -> dict[int, str]:
    """``Net.attn``-style names: the root's class, then the module's path in it."""
    prefix = type(root).__name__
    return {id(m): f"{prefix}.{name}" if name else prefix for name, m in root.named_modules()}


@contextlib.contextmanager
def _restored(root: nn.Module, call: ModelCall) -> Iterator[None]:
    """Everything the re-run touches is put back: buffers, ``.grad``, RNG states, training modes."""
    buffers = [(b, b.detach().clone()) for b in root.buffers()]
    params = list(root.parameters())
    grads = [p.grad for p in params]
    modes = [(m, m.training) for m in root.modules()]
    cpu_rng, cuda_rng = torch.get_rng_state(), cuda_rng_states()
    for p in params:
        p.grad = None
    if call.cpu_rng is not None:
        torch.set_rng_state(call.cpu_rng)
    if call.cuda_rng is not None:
        torch.cuda.set_rng_state_all(call.cuda_rng)
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
        for p, grad in zip(params, grads, strict=True):
            p.grad = grad
        for module, training in modes:
            module.training = training
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def _forward_hooks(root: nn.Module, search: _Search) -> list[RemovableHandle]:
    def before(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if search.found is None and not _finite(_tensors((args, kwargs))):
            if search.stack:
                callee = search.names.get(id(module))
                search.forward_found(search.stack[-1], f"its own code passed a non-finite input to {callee}")
            else:
                search.found = {"module": "input", "class": None, "phase": "forward", "inputs_finite": False,
                                "why": "the model's inputs (the batch) hold NaN or Inf"}
        search.stack.append(module)

    def after(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        search.stack.pop()
        if search.found is None and not _finite(_tensors(output)) and _finite(_tensors((args, kwargs))):
            search.forward_found(module, "its output is non-finite while its inputs were finite")
        hooks = search.handles
        hooks += [t.register_hook(lambda grad, m=module: _output_grad(search, m, grad))
                  for t in _tensors(output) if t.requires_grad]
        hooks += [t.register_hook(lambda grad, m=module: _input_grad(search, m, grad, "input"))
                  for t in _tensors((args, kwargs)) if t.requires_grad]
        hooks += [p.register_hook(lambda grad, m=module: _input_grad(search, m, grad, "parameter"))
                  for p in module.parameters(recurse=False) if p.requires_grad]

    return [module.register_forward_pre_hook(before, with_kwargs=True) for module in root.modules()] + [
        module.register_forward_hook(after, with_kwargs=True) for module in root.modules()]


def _output_grad(search: _Search, module: nn.Module, grad: torch.Tensor) -> None:
    (search.finite_out if _finite([grad]) else search.bad_out).add(id(module))


def _input_grad(search: _Search, module: nn.Module, grad: torch.Tensor, what: str) -> None:
    if search.found is None and not _finite([grad]):
        search.backward_found(module, what)


def rerun(call: ModelCall) -> dict[str, Any]:
    """Re-run one captured call: the origin found (``reproduced`` True) or a finite re-run."""
    root = call.module
    search = _Search(module_names(root))
    handles: list[RemovableHandle] = []
    with _restored(root, call):
        try:
            handles = _forward_hooks(root, search)
            with torch.enable_grad():
                output = root(*call.args, **call.kwargs)
            outputs = [t for t in _tensors(output) if t.requires_grad]
            if search.found is None and not _finite(outputs):
                search.forward_found(root, "its output is non-finite")
            if search.found is None and not _finite(call.outputs):
                return {"reproduced": False, "phase": "forward",
                        "why": "the step's own forward produced a non-finite output; the re-run's is finite"}
            if search.found is None and outputs:
                # The loss is not known: the backward starts from the gradient of the outputs' mean,
                # which reaches every value (a singular derivative shows whatever the loss).
                seeds = [torch.full_like(t, 1.0 / max(t.numel(), 1)) for t in outputs]
                torch.autograd.backward(outputs, seeds)
        finally:
            for handle in handles + search.handles:
                handle.remove()
    if search.found is None and call.outputs:
        why = ("the model's forward and backward re-run finite, and its output in the step was finite: the "
               "non-finite gradient came from the loss function (not re-run: it is not known), or from a "
               "one-off fault in the backward")
        return {"module": "loss", "class": None, "phase": None, "inputs_finite": True, "reproduced": None,
                "why": why}
    if search.found is None:
        return {"reproduced": False}
    return {**search.found, "reproduced": True}


def find_origin(calls: list[ModelCall]) -> dict[str, Any]:
    """Re-run the step's calls until one reproduces a non-finite value (``details.origin``)."""
    if not calls:
        return {"reproduced": None, "rerun": False,
                "why": "no model call of this step was seen: the model is unknown (give it to the Monitor, "
                       "or keep per-layer stats on so that it is found) or its forward ran without gradients"}
    if not _finite(list(calls[0].module.parameters())):
        return {"reproduced": None, "rerun": False,
                "why": "the weights are already non-finite: the step that went wrong first was not checked "
                       "(the gradient norm's budget skipped it; grad_norm_budget=1.0 or on_nonfinite='skip' "
                       "or 'stop' checks every step: `tuimon run --grad-norm-budget 1` or "
                       "`--on-nonfinite skip`)"}
    started = time.perf_counter()
    results = []
    for index, call in enumerate(calls):
        result = rerun(call)
        result["call"] = index
        results.append(result)
        if result["reproduced"]:
            break
    origin = next((r for r in results if r["reproduced"]), None) or next(
        (r for r in results if r.get("phase")), results[-1])
    if not origin["reproduced"]:
        origin = {"module": None, "class": None, "phase": None, "inputs_finite": None,
                  "why": "the re-run of the step's model calls is finite, forward and backward", **origin}
    origin.update(rerun=True, calls=len(calls), rerun_s=round(time.perf_counter() - started, 4),
                  rng_kept=calls[0].cpu_rng is not None or calls[0].cuda_rng is not None)
    return origin
