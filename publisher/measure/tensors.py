"""Small torch helpers shared by the layer samples, the detectors and the invariant checks.

Parameter names, the user's module inside DDP and ``torch.compile`` wrappers, strided samples of
large tensors, stacking results that live on several devices: each of these was needed by more
than one measurement, and one definition keeps them agreeing (a parameter has the same name in a
layer sample as in an invariant violation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


class ParamNamer:
    """Human names for parameters: module paths when a model is known, else optimizer positions."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}

    def add_root(self, root: torch.nn.Module, prefix: str = "") -> None:
        for name, param in root.named_parameters(remove_duplicate=False):
            self._names.setdefault(id(param), prefix + name)

    def name(self, param: torch.Tensor, fallback: str) -> str:
        return self._names.get(id(param), fallback)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's module inside DDP/DataParallel and ``torch.compile`` wrappers.

    Hooks go on the inner module so that a forward through either the wrapper or the raw module is
    seen, and parameter names carry no ``module.`` prefix.
    """
    while True:
        inner = getattr(model, "module", None)
        if isinstance(inner, torch.nn.Module) and isinstance(
            model, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)
        ):
            model = inner
            continue
        original = getattr(model, "_orig_mod", None)
        if isinstance(original, torch.nn.Module):
            model = original
            continue
        return model


def stack_on(values: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Stack 0-dim results that may live on several devices (a model split across GPUs)."""
    return torch.stack([v if v.device == device else v.to(device) for v in values])


def flat_sample(tensor: torch.Tensor, stride: int) -> torch.Tensor:
    """Every ``stride``-th element of the flattened tensor: a view when the tensor is contiguous."""
    flat = tensor.detach().reshape(-1)
    return flat if stride == 1 else flat[::stride]


def sample_stride(numel: int, limit: int) -> int:
    return max(1, math.ceil(numel / limit))


def is_checkable(param: torch.Tensor) -> bool:
    """Floating (or complex) and non-empty: the tensors whose values the checks compare."""
    return (param.is_floating_point() or param.is_complex()) and param.numel() > 0


#: The tensor types whose values a measurement reads: subclasses are left alone (``FakeTensor``
#: and ``FunctionalTensor`` while ``torch.compile`` traces, ``DTensor`` shards, users' own).
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def readable(tensor: torch.Tensor) -> bool:
    """Whether a measurement can read ``tensor``'s values: a plain dense tensor of real numbers on a
    device that holds values. Sparse, nested, meta and complex tensors and tensor subclasses (a
    traced model's fake tensors) are said to be unmeasured rather than fail a measurement; an
    empty one is readable (its statistics are NaN)."""
    return (type(tensor) in _PLAIN_TYPES and tensor.layout is torch.strided and not tensor.is_nested
            and not tensor.is_complex() and tensor.device.type != "meta")
